"""A float16 .trx stays memory-mapped as float16 (issue 41): opening it for a view that draws from
its own buffers converts no point (the view makes each uploaded chunk float32), and the rows read
(a level of detail, a selection, a subset) are those of converting the whole file, bit for bit."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests._mapped_files import file_rss, read_eagerly
from tractlens.app.fiber_arrays import display_points
from tractlens.app.fiber_cache import FiberArrayCache
from tractlens.app.io import load_tractogram, tractogram_points
from tractlens.app.io.tractogram_stream import open_tractogram_writer
from tractlens.app.model import Layer, Tractogram

AFFINE = np.array([[-1.25, 0.02, 0, 90], [0.01, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])


def _float16_trx(tmp_path: Path, n=3000, points=40, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    steps = rng.normal(scale=0.4, size=(n * points, 3)).astype(np.float32)
    pts = (np.cumsum(steps.reshape(n, points, 3), axis=1) + 60).reshape(-1, 3)
    offsets = np.arange(0, n * points + 1, points, dtype=np.int64)
    tract = Tractogram(pts, offsets, AFFINE, (145, 174, 145), streamline_scalars={"w": rng.random(n)})
    path = tmp_path / "half.trx"
    with open_tractogram_writer(path, AFFINE, tract.dimensions, positions_dtype="float16") as writer:
        writer.append(tract)
    return path


@pytest.mark.parametrize("own_buffers", [True, False])
def test_opening_a_float16_trx_makes_no_float32_copy(tmp_path, monkeypatch, own_buffers):
    """1 M points: 6 MB of float16 in the file, 12 MB as float32. The window's open (read, then
    the display arrays for the view's own buffers) allocates neither; the control (a view that
    draws through VTK, which needs float32) makes the float32 copy as before."""
    path = _float16_trx(tmp_path, n=25_000, points=40)
    monkeypatch.setattr(tractogram_points, "CHECK_CHUNK_POINTS", 1 << 14)
    load_tractogram(path)  # imports and first-use caches out of the count
    cache = FiberArrayCache()
    cache.shader_drawn_min_points = 1 if own_buffers else None
    tracemalloc.start()
    try:
        tract = load_tractogram(path)
        arrays = cache.prepare(Layer("t", tract, "tractogram"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tract.n_points == 1_000_000 and tract.mapped.world.dtype == np.float16
    if own_buffers:
        assert arrays.points is tract.mapped.world and arrays.points.dtype == np.float16
        assert not tract.mapped.made
        assert peak < 4e6, peak  # offsets, the check's chunks, the levels' ranges: no 12 MB copy
        if Path("/proc/self/smaps").exists():
            assert file_rss(path) == 0  # nothing of the file's map is resident either
    else:
        assert arrays.points.dtype == np.float32 and tract.mapped.made
        assert peak > 12e6, peak


def test_rows_read_from_a_float16_trx_equal_the_whole_conversion(tmp_path):
    path = _float16_trx(tmp_path)
    got, eager = load_tractogram(path), read_eagerly(path)
    assert got.mapped is not None and got.mapped.world.dtype == np.float16
    np.testing.assert_array_equal(got.points_rows(7, 23_456), eager.points[7:23_456])
    index = np.array([0, 5, 119_999, 40_000, 3, 77_777])
    np.testing.assert_array_equal(got.points_take(index), eager.points[index])
    keep = np.arange(len(got)) % 7 == 2
    subset, expected = got.subset(keep), eager.subset(keep)
    np.testing.assert_array_equal(subset.points, expected.points)
    np.testing.assert_array_equal(subset.offsets, expected.offsets)
    # the 3-D view's millimetres, and what the slice views draw (a level's points on the grid)
    points, affine = display_points(got, half=True)
    assert points is got.mapped.world and np.array_equal(affine, np.eye(4))
    caches = FiberArrayCache(), FiberArrayCache()
    for cache in caches:
        cache.shader_drawn_min_points = 1  # the window's own buffers
    mine = caches[0].on_reference(Layer("t", got, "tractogram"), got.affine)
    theirs = caches[1].on_reference(Layer("e", eager, "tractogram"), got.affine)
    for k in (0, 2, 3):  # points, offsets, streamline of each point
        np.testing.assert_array_equal(mine[k], theirs[k])
    # direction colours: from millimetre differences here, rotated voxel ones there (within a unit)
    assert np.abs(mine[1].astype(int) - theirs[1].astype(int)).max() <= 1
    assert not got.mapped.made
    np.testing.assert_array_equal(got.points, eager.points)  # and all of them, once asked for


def test_a_selection_over_a_float16_trx_equals_the_eager_one(tmp_path, device):
    from tractlens.app.pipelines.select import index_on_grid

    path = _float16_trx(tmp_path, n=2000)
    got, eager = load_tractogram(path), read_eagerly(path)
    masks = [np.zeros((145, 174, 145), bool), np.zeros((145, 174, 145), bool)]
    centre = np.rint(eager.points[:40_000].mean(axis=0)).astype(int)
    masks[0][tuple(slice(c - 3, c + 3) for c in centre)] = True
    masks[1][tuple(slice(c + 2, c + 5) for c in centre)] = True
    result = index_on_grid(got, got.affine, device).select([masks[0]], [masks[1]])
    expected = index_on_grid(eager, got.affine, "cpu").select([masks[0]], [masks[1]])
    np.testing.assert_array_equal(result.bits, expected.bits)
    assert 0 < result.selected.sum() < len(got)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_float16_trx_with_bad_positions_is_refused(tmp_path, bad):
    from tractlens.app.errors import InputError

    path = _float16_trx(tmp_path, n=100)
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.startswith("positions"))
        assert info.filename.endswith("float16")
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    with open(path, "r+b") as handle:  # point 1234's z, in place (the file stays uncompressed)
        handle.seek(start + (1234 * 3 + 2) * 2)
        handle.write(np.float16(bad).tobytes())
    with pytest.raises(InputError, match="NaN or infinite"):
        load_tractogram(path)
