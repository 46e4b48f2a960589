"""Reading a tractogram converts its points to voxel coordinates a chunk at a time: the values
of the whole conversion, at the memory of the float32 result (not 72 bytes a point), and the
pages of a memory-mapped .trx leave the resident set once read."""

from __future__ import annotations

import tracemalloc

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.io import load_tractogram, save_tractogram
from tractlens.app.io import tractogram as tractogram_io
from tractlens.app.io._pages import release_pages
from tractlens.app.model import Tractogram


def _tractogram(n_streamlines=4000, points=50, seed=0):
    rng = np.random.default_rng(seed)
    steps = rng.normal(scale=0.4, size=(n_streamlines * points, 3)).astype(np.float32)
    pts = (np.cumsum(steps.reshape(n_streamlines, points, 3), axis=1) + 40).reshape(-1, 3)
    affine = np.array([[-1.25, 0.02, 0, 90], [0.01, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])
    offsets = np.arange(0, n_streamlines * points + 1, points, dtype=np.int64)
    return Tractogram(pts, offsets, affine, (145, 174, 145), {"fa": rng.random(len(pts)).astype(np.float32)})


@pytest.mark.parametrize("suffix", [".trx", ".trk", ".tck"])
def test_chunked_conversion_equals_the_whole_one(tmp_path, monkeypatch, suffix):
    tract = _tractogram()
    path = save_tractogram(tract, tmp_path / f"t{suffix}")
    reference = (tract.affine, tract.dimensions)
    monkeypatch.setattr(tractogram_io, "LOAD_CHUNK_POINTS", 4096)
    got = load_tractogram(path, reference)
    monkeypatch.setattr(tractogram_io, "LOAD_CHUNK_POINTS", 1 << 30)
    whole = load_tractogram(path, reference)
    np.testing.assert_array_equal(got.points, whole.points)  # bit for bit
    np.testing.assert_array_equal(got.offsets, whole.offsets)
    # and what converting everything at once in float64, then casting, gives
    mm = tract.points.astype(np.float64) @ tract.affine[:3, :3].T + tract.affine[:3, 3]
    expected = nib.affines.apply_affine(np.linalg.inv(whole.affine), mm.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(got.points, expected.astype(np.float32), atol=1e-4)


def test_reading_a_trx_holds_the_float32_points_not_float64_copies(tmp_path, monkeypatch):
    tract = _tractogram(n_streamlines=10000, points=100)  # 1 M points: 12 MB as float32
    path = save_tractogram(Tractogram(tract.points, tract.offsets, tract.affine, tract.dimensions), tmp_path / "t.trx")
    chunk = 1 << 14
    monkeypatch.setattr(tractogram_io, "LOAD_CHUNK_POINTS", chunk)
    tracemalloc.start()
    try:
        got = load_tractogram(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n = len(got.points)
    assert n == 1_000_000
    # the result (12 B/point) and a chunk per thread (its float64 points and their conversion);
    # before: a float32 copy, two float64 arrays and a cast (72 B/point)
    per_thread = chunk * 3 * 8 * 3
    assert peak < 12 * n + tractogram_io.LOAD_THREADS * per_thread + (1 << 20), f"{peak / n:.1f} bytes per point"


def test_release_pages_only_for_shared_or_read_only_maps(tmp_path):
    path = tmp_path / "a.bin"
    np.arange(1 << 20, dtype=np.float32).tofile(path)
    for mode, released in (("r", True), ("r+", True), ("c", False)):
        mapped = np.memmap(path, dtype=np.float32, mode=mode)
        total = float(mapped[::1024].sum())  # touch the pages
        assert release_pages(mapped[10:]) is released, mode
        assert float(mapped[::1024].sum()) == total  # the values are still there
        del mapped
    assert release_pages(np.zeros(10)) is False


def test_file_region_reads_what_the_map_holds(tmp_path):
    """A memory map at an unaligned offset, and a view of it, are read back through pread equal."""
    import os

    from tractlens.app.io._pages import file_region, read_rows

    path = tmp_path / "p.bin"
    data = np.random.default_rng(0).random((5000, 3)).astype(np.float32)
    with open(path, "wb") as f:
        f.write(b"x" * 12345)
        f.write(data.tobytes())
    mapped = np.memmap(path, dtype=np.float32, mode="r+", offset=12345, shape=(5000, 3))
    fd = os.open(path, os.O_RDONLY)
    try:
        for view in (mapped, mapped[1234:], mapped[4999:]):
            name, position = file_region(view)
            assert name == str(path)
            np.testing.assert_array_equal(read_rows(fd, position, np.float32, view.shape), view)
    finally:
        os.close(fd)
    assert file_region(mapped[:, :2]) is None  # not contiguous
    assert file_region(np.zeros((3, 3))) is None


def test_pread_rows_read_what_the_map_holds_without_mapping_it(tmp_path):
    from tractlens.app.io._pages import PreadRows

    path = tmp_path / "p.bin"
    data = np.random.default_rng(1).random((3000, 3)).astype(np.float32)
    with open(path, "wb") as f:
        f.write(b"y" * 777)
        f.write(data.tobytes())
    mapped = np.memmap(path, dtype=np.float32, mode="r+", offset=777, shape=(3000, 3))
    rows = PreadRows.over(mapped)
    assert isinstance(rows, PreadRows) and len(rows) == 3000 and rows.shape == (3000, 3)
    for lo, hi in ((0, 3000), (5, 17), (2990, 5000), (40, 40)):
        np.testing.assert_array_equal(rows[lo:hi], data[lo:hi])
    np.testing.assert_array_equal(np.asarray(rows), data)
    column = np.memmap(path, dtype=np.float32, mode="r", offset=777, shape=(9000,))
    np.testing.assert_array_equal(PreadRows.over(column)[100:200], data.ravel()[100:200])
    plain = np.zeros((4, 3))
    assert PreadRows.over(plain) is plain  # not a map: the array itself
    with pytest.raises(TypeError):
        rows[::2]


def test_a_view_of_a_read_only_map_is_released_through_its_base(tmp_path):
    path = tmp_path / "v.bin"
    np.arange(1 << 16, dtype=np.float32).tofile(path)
    view = np.asarray(np.memmap(path, dtype=np.float32, mode="r"))  # what a reader hands out
    assert not isinstance(view, np.memmap)
    assert release_pages(view) is True
