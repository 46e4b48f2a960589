"""Opening an uncompressed .trx keeps its positions memory-mapped (issue 41): no point is
converted or copied until something reads the voxel coordinates, and then the values are those
of the eager conversion bit for bit; the display draws the file's millimetres as they are; a
file with NaN or infinite positions is refused as before."""

from __future__ import annotations

import tracemalloc
import zipfile

import numpy as np
import pytest

from tests._mapped_files import read_eagerly
from tractlens.app.errors import InputError
from tractlens.app.fiber_arrays import display_points, grid_box
from tractlens.app.fiber_cache import FiberArrayCache
from tractlens.app.integrity import document_problems
from tractlens.app.io import load_tractogram, save_tractogram
from tractlens.app.io.tractogram_points import _extent, points_bounds
from tractlens.app.model import Document, Layer, Tractogram

AFFINE = np.array([[-1.25, 0.02, 0, 90], [0.01, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])


def _tractogram(n=3000, points=40, seed=0, **scalars):
    rng = np.random.default_rng(seed)
    steps = rng.normal(scale=0.4, size=(n * points, 3)).astype(np.float32)
    pts = (np.cumsum(steps.reshape(n, points, 3), axis=1) + 60).reshape(-1, 3)
    offsets = np.arange(0, n * points + 1, points, dtype=np.int64)
    return Tractogram(pts, offsets, AFFINE, (145, 174, 145), **scalars)


def test_an_uncompressed_trx_opens_mapped_and_converts_nothing(tmp_path):
    rng = np.random.default_rng(1)
    tract = _tractogram(point_scalars={"fa": rng.random(3000 * 40).astype(np.float32)},
                        streamline_scalars={"w": rng.random(3000).astype(np.float32)})  # fmt: skip
    path = save_tractogram(tract, tmp_path / "t.trx")
    got = load_tractogram(path)
    assert got.mapped is not None and not got.mapped.made
    assert got.n_points == 3000 * 40 and len(got) == 3000
    assert isinstance(got.point_scalars["fa"], np.memmap) or isinstance(got.point_scalars["fa"].base, np.memmap)
    # what the window does before its first frame reads no voxel coordinate
    layer = Layer("t", got, "tractogram")
    cache = FiberArrayCache()
    cache.shader_drawn_min_points = 1
    arrays = cache.prepare(layer)
    doc = Document()
    doc.add_layer(layer)
    assert document_problems(doc) == []
    assert not got.mapped.made
    assert arrays.points is got.mapped.world and np.array_equal(arrays.affine, np.eye(4))
    # and the values, once read, are the eager conversion's, bit for bit
    eager = read_eagerly(path)
    np.testing.assert_array_equal(got.points_rows(7, 2345), eager.points[7:2345])
    index = np.array([0, 5, 119_999, 40_000, 3])
    np.testing.assert_array_equal(got.points_take(index), eager.points[index])
    np.testing.assert_array_equal(got[17], eager[17])
    assert not got.mapped.made
    np.testing.assert_array_equal(got.points, eager.points)
    assert got.mapped.made
    np.testing.assert_array_equal(got.points_rows(7, 2345), eager.points[7:2345])


def test_opening_a_mapped_trx_allocates_no_copy_of_the_points(tmp_path, monkeypatch):
    from tractlens.app.io import tractogram_points

    tract = _tractogram(n=20_000, points=50)  # 1 M points: 12 MB as float32
    path = save_tractogram(tract, tmp_path / "t.trx")
    monkeypatch.setattr(tractogram_points, "CHECK_CHUNK_POINTS", 1 << 14)
    load_tractogram(path)  # imports and first-use caches out of the count
    cache = FiberArrayCache()
    cache.shader_drawn_min_points = 1  # drawn from the view's own buffers, as a whole brain is
    tracemalloc.start()
    try:
        got = load_tractogram(path)
        cache.prepare(Layer("t", got, "tractogram"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.n_points == 1_000_000
    # offsets and lengths (20,000 streamlines), the check's chunks (16 k points a thread), the
    # levels' index arrays: a float32 copy of the points alone would be 12 MB
    assert peak < 4e6, peak


def test_the_display_draws_the_file_millimetres_with_the_grid_box_around_them(tmp_path):
    tract = _tractogram(n=200)
    got = load_tractogram(save_tractogram(tract, tmp_path / "t.trx"))
    points, affine = display_points(got)
    np.testing.assert_array_equal(affine, np.eye(4))
    mm = tract.points.astype(np.float64) @ AFFINE[:3, :3].T + AFFINE[:3, 3]
    np.testing.assert_allclose(points, mm, atol=1e-4)
    box = grid_box(got, affine)
    voxel_corners = grid_box(tract, tract.affine)  # voxel coordinates: the grid's own corners
    assert voxel_corners.min() == -0.5 and voxel_corners.max() == 173.5
    np.testing.assert_allclose(box, voxel_corners @ AFFINE[:3, :3].T + AFFINE[:3, 3], atol=1e-4)
    # once the voxel coordinates are made, the view draws those (no second frame of reference)
    got.points  # noqa: B018
    points, affine = display_points(got)
    assert points is got.points and np.array_equal(affine, got.affine)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_mapped_trx_with_bad_positions_is_refused(tmp_path, bad):
    tract = _tractogram(n=100)
    path = save_tractogram(tract, tmp_path / "t.trx")
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.startswith("positions"))
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    with open(path, "r+b") as handle:  # point 1234's y, in place (the file stays uncompressed)
        handle.seek(start + (1234 * 3 + 1) * 4)
        handle.write(np.float32(bad).tobytes())
    with pytest.raises(InputError, match="NaN or infinite"):
        load_tractogram(path)


def test_bounds_are_read_in_chunks_and_keep_nan(monkeypatch):
    from tractlens.app.io import tractogram_points

    rng = np.random.default_rng(3)
    points = rng.normal(size=(10_001, 3)).astype(np.float32)
    monkeypatch.setattr(tractogram_points, "CHECK_CHUNK_POINTS", 1000)
    low, high = points_bounds(points)
    np.testing.assert_array_equal(low, points.min(axis=0))
    np.testing.assert_array_equal(high, points.max(axis=0))
    points[9_999, 2] = np.nan
    low, high = points_bounds(points)
    assert np.isnan(low[2]) and np.isnan(high[2]) and np.isfinite(low[:2]).all()
    for n in (0, 1, 31, 32, 33, 97):
        part = rng.normal(size=(n, 3)).astype(np.float32)
        if n:
            lo, hi = _extent(part)
            np.testing.assert_array_equal(lo, part.min(axis=0))
            np.testing.assert_array_equal(hi, part.max(axis=0))


def test_a_mapped_trx_replaced_on_disk_still_reads_what_was_opened(tmp_path):
    first, second = _tractogram(n=100, seed=0), _tractogram(n=100, seed=1)
    path = save_tractogram(first, tmp_path / "t.trx")
    expected = read_eagerly(save_tractogram(first, tmp_path / "copy.trx")).points
    got = load_tractogram(path)
    save_tractogram(second, path)  # atomic: a new file under the same name
    np.testing.assert_array_equal(got.points_rows(0, 4000), expected)
    np.testing.assert_array_equal(got.points, expected)


def test_float64_positions_are_converted_when_read(tmp_path):
    tract = _tractogram(n=100)
    got = load_tractogram(save_tractogram(tract, tmp_path / "t.trx", exact=True))
    assert got.mapped is None  # sessions' exact files: the view could not draw float64 as it is
    np.testing.assert_array_equal(got.points, tract.points)


@pytest.mark.parametrize("same_grid", [True, False])
def test_a_selection_over_a_mapped_trx_equals_the_eager_one(tmp_path, device, same_grid):
    """The selection index of a mapped tractogram (on the GPU: uploaded a chunk at a time as it is
    converted, no voxel copy in host memory) selects what the eager tractogram's does."""
    from tractlens.app.pipelines.select import index_on_grid

    tract = _tractogram(n=2000)
    path = save_tractogram(tract, tmp_path / "t.trx")
    got, eager = load_tractogram(path), read_eagerly(path)
    grid = got.affine if same_grid else got.affine @ np.diag([2.0, 2.0, 2.0, 1.0])
    shape = (145, 174, 145) if same_grid else (73, 87, 73)
    masks = [np.zeros(shape, bool), np.zeros(shape, bool)]
    centre = np.rint(got.points_rows(0, 40000).mean(axis=0) / (1 if same_grid else 2)).astype(int)
    masks[0][tuple(slice(c - 3, c + 3) for c in centre)] = True
    masks[1][tuple(slice(c + 2, c + 5) for c in centre)] = True
    index = index_on_grid(got, grid, device)
    expected = index_on_grid(eager, grid, "cpu").select([masks[0]], [masks[1]])
    result = index.select([masks[0]], [masks[1]])
    np.testing.assert_array_equal(result.bits, expected.bits)
    assert 0 < result.selected.sum() < len(got)
    assert got.mapped.made == (not index.backend.is_gpu and same_grid)  # the CPU's index is the voxel array


def test_a_mapped_tractogram_pickles_and_copies_as_arrays(tmp_path):
    import copy
    import pickle

    tract = _tractogram(n=50)
    got = load_tractogram(save_tractogram(tract, tmp_path / "t.trx"))
    for twin in (pickle.loads(pickle.dumps(got)), copy.deepcopy(got)):
        assert twin.mapped is not None and not isinstance(twin.mapped.world, np.memmap)
        np.testing.assert_array_equal(twin.points, got.points)
