"""COMMIT at whole-brain scale: the compact segments and operator equal the straightforward
construction exactly, and host memory grows by at most 60 bytes per segment on the CPU engine."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from tests.test_commit import MODELS, random_streamlines, small_problem
from tractlens.gpu import commit_operator
from tractlens.gpu.commit import N_ORIENTATIONS
from tractlens.gpu.commit_operator import column_norms, ec_compartments, ec_from_segments, ic_per_row
from tractlens.gpu.commit_segments import _chunk_segments, segments
from tractlens.gpu.commit_sparse import SparseOperator, orientation_pairs, pair_structure


def _segments_in_one_piece(points, offsets, rows, voxel_size, min_length_mm=1e-3):
    """All streamlines cut at once, int64 arrays, one global lexsort by (row, fiber): the
    construction the chunked counting sort replaces."""
    n_rows = int(rows.max()) + 1
    fiber, row, orient, length = _chunk_segments(
        np,
        np.asarray(points, np.float64),
        np.asarray(offsets, np.int64),
        np.ascontiguousarray(rows, np.int64).ravel(),
        np.array(rows.shape),
        np.asarray(voxel_size, np.float64),
        n_rows,
    )
    keep = length >= min_length_mm
    fiber, row, orient, length = fiber[keep], row[keep], orient[keep], length[keep]
    order = np.lexsort(np.stack([fiber, row]))
    return row[order], fiber[order], length[order], orient[order]


def _grid_with_holes(shape, seed):
    mask = np.random.default_rng(seed).random(shape) > 0.15
    rows = np.full(shape, -1)
    rows[mask] = np.arange(mask.sum())
    return rows


@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize("chunk_points", [37, 500, 10**6])
@pytest.mark.parametrize("seed", [0, 1])
def test_segments_in_chunks_equal_the_whole_construction(chunk_points, seed, two_pass):
    rng = np.random.default_rng(seed)
    shape = (9, 8, 10)
    points, offsets = random_streamlines(rng, 120, shape, points=25)
    rows = _grid_with_holes(shape, seed)
    seg = segments(points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=chunk_points, two_pass=two_pass)
    row, fiber, length, orient = _segments_in_one_piece(points, offsets, rows, (2.0, 2.0, 2.5))
    assert len(seg) == len(row) > 1000
    np.testing.assert_array_equal(seg.row, row)
    np.testing.assert_array_equal(seg.fiber, fiber)
    np.testing.assert_array_equal(seg.length, length.astype(np.float32))  # bit for bit, rounded once
    np.testing.assert_array_equal(seg.orient, orient)
    assert (seg.row.dtype, seg.fiber.dtype, seg.length.dtype, seg.orient.dtype) == (
        np.int32,
        np.int32,
        np.float32,  # on the host, for the CPU engine (float64 when cut for a GPU)
        np.uint16,
    )
    assert seg.n_fibers == 120


@pytest.mark.parametrize("two_pass", [False, True])
def test_cutting_on_the_host_holds_the_segments_about_once(two_pass):
    """tracemalloc peak of cutting many chunks on the host: at most
    HOST_CUT_PEAK_BYTES (one pass) or HOST_SEGMENT_BYTES (two passes) a segment, plus each
    cutting thread's chunk of working memory — not the chunks' copies and the sorted whole side
    by side."""
    import tracemalloc

    from tractlens.gpu.commit_segments import HOST_CUT_PEAK_BYTES, HOST_SEGMENT_BYTES, host_cut_plan

    rng = np.random.default_rng(7)
    shape = (30, 30, 30)
    points, offsets = random_streamlines(rng, 6000, shape, points=60)
    rows = _grid_with_holes(shape, 7)
    chunk = 2_000  # many chunks: the segments outweigh one chunk's working memory
    tracemalloc.start()
    try:
        seg = segments(points, offsets, rows, (2.0, 2.0, 2.0), chunk_points=chunk, two_pass=two_pass)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per_segment = HOST_SEGMENT_BYTES if two_pass else HOST_CUT_PEAK_BYTES
    _, threads = host_cut_plan()
    working = 640 * chunk * threads + 8 * rows.size * 3  # each thread's chunk; counts, cursors, the row map
    assert len(seg) > 250 * chunk
    assert peak <= per_segment * len(seg) + working, (peak / len(seg), len(seg))


@pytest.mark.parametrize("threads", [2, 5])
def test_segments_cut_on_threads_equal_one_thread(monkeypatch, threads):
    """Chunks cut on several threads (in flight at once, taken in order): the same segments, bit
    for bit, as on one; a damaged point met by a thread is reported as on one."""
    from tractlens.gpu.commit_segments import NonFinitePoints

    rng = np.random.default_rng(3)
    shape = (9, 8, 10)
    points, offsets = random_streamlines(rng, 200, shape, points=25)
    rows = _grid_with_holes(shape, 3)
    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    one = segments(points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=60)
    monkeypatch.setenv("TRACTLENS_THREADS", str(threads))
    many = segments(points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=60)
    for name in ("row", "fiber", "length", "orient"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name))
    points = points.copy()
    points[3000] = np.nan
    with pytest.raises(NonFinitePoints, match="from number"):
        segments(points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=60)


def test_segments_transform_each_chunk_as_points_on_does():
    """Points in another frame (world mm) and ``to_voxel``: the same segments as the points
    moved onto the grid first (Tractogram.points_on), chunk by chunk."""
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(4)
    shape = (10, 9, 8)
    voxels, offsets = random_streamlines(rng, 80, shape, points=30)
    grid = np.array([[2.0, 0, 0, -9.0], [0, 2.0, 0, 4.0], [0, 0, 2.5, 1.0], [0, 0, 0, 1]])
    own = np.array([[1.0, 0, 0, 0.5], [0, 1.0, 0, -0.25], [0, 0, 1.0, 2.0], [0, 0, 0, 1]])
    world = (voxels @ grid[:3, :3].T + grid[:3, 3]).astype(np.float32)
    tract = Tractogram(world, offsets.astype(np.int64), own, shape, {}, {}, name="t")
    rows = _grid_with_holes(shape, 4)
    expected = segments(tract.points_on(grid), offsets, rows, (2.0, 2.0, 2.5))
    got = segments(tract.points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=100, to_voxel=np.linalg.solve(grid, own))
    for name in ("row", "fiber", "length", "orient"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))


def test_row_passes_in_chunks_equal_the_whole(monkeypatch):
    """EC pairs and the IC map over chunks of whole rows: the same values as over all at once."""
    problem, *_ = small_problem(seed=3, n_fibers=60)
    seg = problem.segments
    weight = np.random.default_rng(0).random(seg.n_fibers)
    whole_ec = ec_compartments(seg.row, seg.orient)
    whole_ic = np.bincount(seg.row, weights=seg.length * weight[seg.fiber], minlength=problem.n_rows)
    monkeypatch.setattr(commit_operator, "CHUNK", 50)
    assert len(list(commit_operator.row_chunks(seg.row))) > 10
    for got, want in zip(ec_from_segments(seg), whole_ec, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ic_per_row(seg, weight, problem.n_rows), whole_ic)


@pytest.mark.parametrize("model", MODELS)
def test_sparse_operator_from_compact_pairs_equals_the_coo_construction(model, monkeypatch):
    """S built straight into CSR arrays in row chunks is the matrix the COO triplets gave,
    entry for entry and in the same storage order; the column norms over voxel blocks equal the
    reference."""
    problem, *_ = small_problem(seed=5, n_fibers=70, params=MODELS[model])
    seg = problem.segments
    monkeypatch.setattr(commit_operator, "CHUNK", 64)
    pairs = pair_structure(problem)
    row, orient, pair_of_segment = orientation_pairs(problem)
    coo = sparse.csr_matrix((seg.length, (pair_of_segment, seg.fiber)), shape=(len(row), problem.n_fibers))
    np.testing.assert_array_equal(pairs.row, row)
    np.testing.assert_array_equal(pairs.orient, orient)
    np.testing.assert_array_equal(pairs.indptr, coo.indptr)
    np.testing.assert_array_equal(pairs.fiber, coo.indices)
    np.testing.assert_array_equal(pairs.length, coo.data)
    assert pairs.fiber.dtype == np.int32
    monkeypatch.setattr("tractlens.gpu.commit_sparse.NORM_BLOCK_PAIRS", 16)
    op = SparseOperator(problem, pairs)
    np.testing.assert_allclose(op.column_norms(), column_norms(problem), rtol=1e-12)


def test_sparse_column_norms_in_blocks_equal_one_block(monkeypatch):
    problem, *_ = small_problem(seed=6, n_fibers=50)
    whole = SparseOperator(problem).column_norms()
    monkeypatch.setattr("tractlens.gpu.commit_sparse.NORM_BLOCK_PAIRS", 8)
    np.testing.assert_array_equal(SparseOperator(problem).column_norms(), whole)


def test_orientations_fit_in_uint16():
    assert N_ORIENTATIONS - 1 <= np.iinfo(np.uint16).max


def test_commit_host_memory_grows_at_most_60_bytes_per_segment(monkeypatch):
    """tracemalloc peak of the CPU pipeline (tractogram included) at two sizes of bundle-like
    streamlines on one grid: the slope between them is at most 60 bytes per segment. On one
    thread: with several, how many cut chunks are held at the peak depends on the threads'
    timing (one chunk more at the larger size gave 76 under load in CI); the threads'
    bound on chunks in flight has a test of its own."""
    from tests.benchmarks.bench_commit import pipeline_memory

    monkeypatch.setenv("TRACTLENS_THREADS", "1")

    shape = (24, 24, 24)  # about 60 and 120 segments a voxel (a whole brain: about 250)
    small = pipeline_memory(20_000, iterations=2, shape=shape)
    large = pipeline_memory(40_000, iterations=2, shape=shape)
    assert large["segments"] > 1.9 * small["segments"] > 1.6e6
    slope = (large["traced_peak_bytes"] - small["traced_peak_bytes"]) / (large["segments"] - small["segments"])
    assert slope <= 60, f"{slope:.1f} bytes per segment"


def test_kept_streamlines_equal_the_subset():
    """The filtered tractogram through a point mask: the same streamlines and scalars as
    Tractogram.subset (which goes through int64 point indices)."""
    from tractlens.app.model import Tractogram
    from tractlens.app.pipelines.commit import kept_streamlines

    rng = np.random.default_rng(2)
    points, offsets = random_streamlines(rng, 30, (8, 8, 8), points=12)
    offsets = np.r_[offsets[:10], offsets[10:] + 3]  # uneven lengths
    points = np.concatenate([points, rng.random((3, 3))]).astype(np.float32)
    n_points = len(points)
    tract = Tractogram(
        points,
        offsets.astype(np.int64),
        np.eye(4),
        (8, 8, 8),
        {"fa": rng.random(n_points).astype(np.float32), "rgb": rng.random((n_points, 3))},
        {"id": np.arange(30.0)},
        name="t",
    )
    keep = rng.random(30) > 0.4
    got, want = kept_streamlines(tract, keep), tract.subset(np.flatnonzero(keep))
    np.testing.assert_array_equal(got.points, want.points)
    np.testing.assert_array_equal(got.offsets, want.offsets)
    for name in ("fa", "rgb"):
        np.testing.assert_array_equal(got.point_scalars[name], want.point_scalars[name])
    np.testing.assert_array_equal(got.streamline_scalars["id"], want.streamline_scalars["id"])
    assert len(kept_streamlines(tract, np.zeros(30, bool))) == 0


def test_ec_column_norms_equal_the_gathered_ones_without_holding_them():
    import tracemalloc

    from tests.benchmarks.bench_commit import synthetic_problem
    from tractlens.gpu.commit_operator import ec_column_norms2

    problem = synthetic_problem(400_000, 120)
    gathered = (problem.lut_ec[problem.ec_orient].astype(np.float64) ** 2).sum(1)  # the old way
    held = len(problem.ec_orient) * problem.n_meas * 8
    tracemalloc.start()
    try:
        norms = ec_column_norms2(problem)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(norms, gathered)  # the same numbers, bit for bit
    assert peak < held / 5, (peak, held)  # a block of columns at a time, not n_ec × M
