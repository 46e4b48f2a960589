"""COMMIT's segments cut on the host keep their voxel rows as starts (one int64 per voxel row)
rather than one int32 per segment: every consumer reads them in that form and gets what the
per-segment rows gave, and the CPU pipeline never makes a row per segment."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import MODELS, random_streamlines, small_problem
from tractlens.gpu import commit_operator, commit_segments
from tractlens.gpu.commit_device import BlockedOperator, row_blocks, sub_problem
from tractlens.gpu.commit_host import HostOperator
from tractlens.gpu.commit_operator import NumpyOperator, Problem, row_chunks
from tractlens.gpu.commit_segments import Segments, row_parts, segments


def _with_row_array(problem: Problem) -> Problem:
    """``problem`` with its segments' rows one per segment (the form a GPU's cut gives)."""
    seg = problem.segments
    rows = Segments(seg.row.copy(), seg.fiber, seg.length, seg.orient, seg.n_fibers)
    return Problem(problem.n_rows, rows, problem.ec_row, problem.ec_orient, problem.lut_ic, problem.lut_ec,
                   problem.lut_iso)  # fmt: skip


def _sparse_rows(seed: int) -> Segments:
    """Segments over 40 rows, some empty (the first two, the last three and a few between), in
    the row-starts form."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, 40)
    counts[[0, 1, 37, 38, 39, 12, 13]] = 0
    n = int(counts.sum())
    return Segments(None, rng.integers(0, 30, n).astype(np.int32), rng.random(n).astype(np.float32),
                    rng.integers(0, 100, n).astype(np.uint16), 30, row_start=np.r_[0, np.cumsum(counts)])  # fmt: skip


@pytest.mark.parametrize("two_pass", [False, True])
def test_segments_cut_on_the_host_hold_one_start_per_row(two_pass):
    rng = np.random.default_rng(2)
    shape = (9, 8, 10)
    points, offsets = random_streamlines(rng, 150, shape, points=25)
    rows = np.arange(np.prod(shape)).reshape(shape)
    seg = segments(points, offsets, rows, (2.0, 2.0, 2.5), chunk_points=200, two_pass=two_pass)
    assert not seg.has_row_array and seg.row_start.dtype == np.int64
    assert len(seg.row_start) == rows.size + 1 and seg.row_start[-1] == len(seg)
    row = seg.row  # made from the starts
    assert row.dtype == np.int32 and np.all(np.diff(row) >= 0)
    np.testing.assert_array_equal(seg.row_start, np.searchsorted(row, np.arange(rows.size + 1)))


def test_the_documented_bytes_are_what_the_host_segments_hold():
    """HOST_SEGMENT_BYTES a segment (streamline, length, orientation) and HOST_ROW_BYTES a voxel
    row: what the memory guard announces for the fit."""
    rng = np.random.default_rng(5)
    shape = (9, 8, 10)
    points, offsets = random_streamlines(rng, 100, shape, points=25)
    rows = np.arange(np.prod(shape)).reshape(shape)
    seg = segments(points, offsets, rows, (2.0, 2.0, 2.5))
    held = seg.fiber.nbytes + seg.length.nbytes + seg.orient.nbytes
    assert held == commit_segments.HOST_SEGMENT_BYTES * len(seg) == 10 * len(seg)
    assert seg.row_start.nbytes == commit_segments.HOST_ROW_BYTES * (rows.size + 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_of_a_slice_and_row_parts_equal_the_row_array(seed):
    seg = _sparse_rows(seed)
    row = seg.row
    rng = np.random.default_rng(seed)
    for _ in range(50):
        a, b = np.sort(rng.integers(0, len(seg) + 1, 2))
        np.testing.assert_array_equal(seg.rows_of(slice(a, b)), row[a:b])
    np.testing.assert_array_equal(seg.rows_of(slice(0, len(seg))), row)
    stored = Segments(row, seg.fiber, seg.length, seg.orient, seg.n_fibers)
    for size in (1, 5, 17, 10**6):
        want = list(row_chunks(row, size))
        for form in (seg, stored):
            got = list(row_parts(form, size))
            assert [part for part, _ in got] == want
            for part, rows in got:
                np.testing.assert_array_equal(rows, row[part])


def test_starts_pad_rows_past_the_last_and_match_the_row_array():
    seg = _sparse_rows(3)
    stored = Segments(seg.row, seg.fiber, seg.length, seg.orient, seg.n_fibers)
    for n_rows in (40, 45):
        np.testing.assert_array_equal(seg.starts(n_rows), stored.starts(n_rows))
    assert len(seg.starts(45)) == 46 and seg.starts(45)[-1] == len(seg)


def test_dropping_empty_rows_renumbers_both_forms_alike():
    seg = _sparse_rows(4)
    stored = Segments(seg.row.copy(), seg.fiber, seg.length, seg.orient, seg.n_fibers)
    held = seg.drop_empty_rows(42)  # two rows past the last start: empty too
    held_stored = stored.drop_empty_rows(42)
    np.testing.assert_array_equal(held, held_stored)
    assert held.sum() == 40 - 7 and not held[[0, 1, 12, 13, 37, 38, 39, 40, 41]].any()
    np.testing.assert_array_equal(seg.row, stored.row)
    assert seg.row_start[-1] == len(seg) and len(seg.row_start) == held.sum() + 1


def test_a_problem_refuses_row_starts_that_do_not_describe_its_segments():
    problem, *_ = small_problem(seed=1)
    seg = problem.segments
    bad = Segments(None, seg.fiber, seg.length, seg.orient, seg.n_fibers, row_start=seg.row_start[::-1])
    with pytest.raises(ValueError, match="row starts"):
        Problem(problem.n_rows, bad, problem.ec_row, problem.ec_orient, problem.lut_ic, problem.lut_ec,
                problem.lut_iso)  # fmt: skip
    with pytest.raises(ValueError, match="one of them"):
        Segments(seg.row, seg.fiber, seg.length, seg.orient, seg.n_fibers, row_start=seg.row_start)


@pytest.mark.parametrize("model", MODELS)
def test_operators_on_row_starts_equal_those_on_rows(model):
    """The host operator reads the same starts either way (bit for bit); the reference, the
    blocked reference (sub-problems of starts) and the row passes agree with the row form."""
    problem, *_ = small_problem(seed=7, n_fibers=60, params=MODELS[model])
    assert not problem.segments.has_row_array
    rows = _with_row_array(problem)
    rng = np.random.default_rng(8)
    x, y = rng.random(problem.n_cols), rng.random(problem.n_rows * problem.n_meas)
    host, host_rows = HostOperator(problem, threads=2), HostOperator(rows, threads=2)
    np.testing.assert_array_equal(host.a(x), host_rows.a(x))
    np.testing.assert_array_equal(host.at(y), host_rows.at(y))
    np.testing.assert_array_equal(host.column_norms(), host_rows.column_norms())
    whole = NumpyOperator(rows)
    blocked = BlockedOperator(problem, NumpyOperator, 40)
    assert row_blocks(problem, 40) == row_blocks(rows, 40) and len(blocked) > 5
    np.testing.assert_allclose(blocked.a(x), whole.a(x), rtol=1e-12)
    np.testing.assert_allclose(blocked.at(y), whole.at(y), rtol=1e-12)
    np.testing.assert_allclose(blocked.column_norms(), whole.column_norms(), rtol=1e-12)
    np.testing.assert_allclose(host.a(x), whole.a(x), rtol=1e-12)
    for r0, r1 in [(0, 5), (7, 30), (problem.n_rows - 3, problem.n_rows)]:
        sub, e0, e1 = sub_problem(problem, r0, r1)
        sub_rows, f0, f1 = sub_problem(rows, r0, r1)
        assert not sub.segments.has_row_array and (e0, e1) == (f0, f1)
        np.testing.assert_array_equal(sub.segments.row, sub_rows.segments.row)
        np.testing.assert_array_equal(sub.segments.fiber, sub_rows.segments.fiber)
    weight = rng.random(problem.n_fibers)
    np.testing.assert_array_equal(
        commit_operator.ic_per_row(problem.segments, weight, problem.n_rows),
        commit_operator.ic_per_row(rows.segments, weight, problem.n_rows),
    )
    for got, want in zip(commit_operator.ec_from_segments(problem.segments),
                         commit_operator.ec_from_segments(rows.segments), strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want)


def test_the_cpu_pipeline_never_makes_a_row_per_segment(monkeypatch, tmp_path):
    """The whole CPU job — the memory guard's sample, the cut, the fit and the written outputs —
    reads the rows as starts: asking for a row per segment fails here."""
    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.pipelines.commit import commit_pipeline, write_commit_outputs
    from tractlens.gpu.commit import CommitParams

    def no_row_array(self):
        if self._row is None:
            raise AssertionError("a row per segment was made")
        return self._row

    dwi, tract = bundle_inputs(600, shape=(16, 16, 16), n_meas=20)
    params = CommitParams(max_iter=20, tol=0.0)
    before = commit_pipeline(dwi, tract, params=params, device="cpu")
    monkeypatch.setattr(commit_segments.Segments, "row", property(no_row_array))
    result = commit_pipeline(dwi, tract, params=params, device="cpu")
    assert not result.problem.segments.has_row_array and len(result.problem.segments) > 10_000
    write_commit_outputs(result, tmp_path)
    np.testing.assert_array_equal(result.weights, before.weights)


# ------------------------------------------------------------------ the GPU path on row starts
@pytest.mark.gpu
@pytest.mark.parametrize("model", MODELS)
def test_device_operators_on_row_starts_equal_the_reference(model):
    """A problem whose segments were cut on the host (rows as starts) on the device, whole and
    in blocks of voxel rows (sub-problems of starts): A x and Aᵀ y within 1e-12 relative of the
    NumPy reference on the row form, the column norms within rtol 1e-12 (float64 sums in another
    order: the bounds of tests/test_commit.py's device test)."""
    from tests.test_commit import _relative
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.commit_device import DeviceOperator

    backend = get_backend("gpu")
    problem, *_ = small_problem(seed=9, n_fibers=60, params=MODELS[model])
    assert not problem.segments.has_row_array
    whole = NumpyOperator(_with_row_array(problem))
    rng = np.random.default_rng(10)
    x, y = rng.random(problem.n_cols), rng.random(problem.n_rows * problem.n_meas)
    ref_ax, ref_aty, ref_norms = whole.a(x), whole.at(y), whole.column_norms()
    blocked = BlockedOperator(problem, lambda sub: DeviceOperator(backend, sub), 40, backend.xp)
    assert len(blocked) > 5
    for op in (DeviceOperator(backend, problem), blocked):
        ax = backend.to_host(op.a(backend.xp.asarray(x)))
        aty = backend.to_host(op.at(backend.xp.asarray(y)))
        assert _relative(ax, ref_ax) < 1e-12 and _relative(aty, ref_aty) < 1e-12
        np.testing.assert_allclose(op.column_norms(), ref_norms, rtol=1e-12)
