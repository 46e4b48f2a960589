"""COMMIT on the CPU: the SciPy sparse operator (gpu.commit_sparse) equals the NumPy reference, and the
pipeline's CPU fit (gpu.commit_host) equals one made with the reference operator."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import MODELS, scheme, small_problem
from tractlens.gpu.commit import lookup_tables
from tractlens.gpu.commit_operator import NumpyOperator, Problem, apply_a_numpy, apply_at_numpy, column_norms
from tractlens.gpu.commit_segments import Segments
from tractlens.gpu.commit_sparse import SparseOperator, cpu_operator, orientation_pairs, sparse_operator_bytes


def _relative(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _with_tables(problem, params, n_dirs, seed):
    tables = lookup_tables(*scheme(np.random.default_rng(seed), n_dirs), params)
    problem.lut_ic, problem.lut_ec, problem.lut_iso = tables["ic"], tables["ec"], tables["iso"]
    return problem


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("n_dirs", [30, 142])  # 64 and 288 measurements
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_operator_equals_the_reference(model, n_dirs, seed):
    """A x, Aᵀ y and the column norms within 1e-12 relative of the NumPy reference (float64 sums
    in another order), on problems with an empty voxel row and a streamline without segments."""
    problem, *_ = small_problem(seed=seed, n_fibers=40 + seed, params=MODELS[model])
    problem = _with_tables(problem, MODELS[model], n_dirs, seed)
    seg = problem.segments
    keep = seg.fiber != 3  # streamline 3 has no segment left
    problem.segments = Segments(seg.row[keep], seg.fiber[keep], seg.length[keep], seg.orient[keep], seg.n_fibers)
    assert (np.bincount(problem.segments.row, minlength=problem.n_rows) == 0).any()
    op = SparseOperator(problem)
    assert op.n_pairs < len(problem.segments)  # streamlines share (voxel, orientation) pairs
    rng = np.random.default_rng(10 + seed)
    x = rng.random(problem.n_cols)
    y = rng.random(problem.n_rows * problem.n_meas)
    ax, aty = op.a(x), op.at(y)
    assert ax.shape == (problem.n_rows * problem.n_meas,) and aty.shape == (problem.n_cols,)
    assert _relative(ax, apply_a_numpy(problem, x).ravel()) < 1e-12
    assert _relative(aty, apply_at_numpy(problem, y)) < 1e-12
    np.testing.assert_allclose(aty, apply_at_numpy(problem, y), rtol=1e-12, atol=1e-13 * np.abs(aty).max())
    np.testing.assert_allclose(op.column_norms(), column_norms(problem), rtol=1e-12)
    assert op.column_norms()[3 :: problem.n_fibers][: problem.n_ic].max() == 0.0
    lhs, rhs = float(ax @ y), float(x @ aty)
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)  # <Ax, y> = <x, Aᵀy>


def test_sparse_operator_accepts_two_dimensional_measurements():
    problem, *_ = small_problem()
    y = np.random.default_rng(3).random((problem.n_rows, problem.n_meas))
    np.testing.assert_allclose(SparseOperator(problem).at(y), NumpyOperator(problem).at(y), rtol=1e-12)


def test_pairs_merge_segments_of_one_voxel_and_orientation():
    """Three segments of two streamlines on one (voxel, orientation) are one pair; S holds their
    summed lengths per streamline."""
    lut = np.random.default_rng(0).random((1, 32761, 5)).astype(np.float32)
    seg = Segments(
        np.array([0, 0, 0, 1], np.int32),
        np.array([0, 1, 1, 1], np.int32),
        np.array([0.5, 1.0, 0.25, 2.0]),
        np.array([7, 7, 7, 9], np.int32),
        2,
    )
    problem = Problem(2, seg, np.array([0, 1], np.int32), np.array([7, 9], np.int32), lut, lut[0], lut[0, :2])
    row, orient, pair_of_segment = orientation_pairs(problem)
    np.testing.assert_array_equal(row, [0, 1])
    np.testing.assert_array_equal(orient, [7, 9])
    np.testing.assert_array_equal(pair_of_segment, [0, 0, 0, 1])
    op = SparseOperator(problem)
    np.testing.assert_allclose(op.s.toarray(), [[0.5, 1.25], [0.0, 2.0]])
    x = np.arange(1.0, problem.n_cols + 1)
    np.testing.assert_allclose(op.a(x), apply_a_numpy(problem, x).ravel(), rtol=1e-14)


def test_cpu_operator_falls_back_to_the_reference_when_memory_is_short():
    problem, *_ = small_problem()
    notes: list[str] = []
    needed = sparse_operator_bytes(problem, len(orientation_pairs(problem)[0]))
    assert isinstance(cpu_operator(problem, notes=notes, available_bytes=2 * needed), SparseOperator)
    assert not notes
    op = cpu_operator(problem, notes=notes, available_bytes=needed)
    assert isinstance(op, NumpyOperator)
    assert len(notes) == 1 and "chunked NumPy reference" in notes[0]
    assert sparse_operator_bytes(problem) >= needed  # one pair per segment at most


def test_commit_pipeline_on_the_cpu_equals_the_reference_operator(demo_dir, monkeypatch):
    """The CPU fit with its compact operator (gpu.commit_host) and with the NumPy reference
    operator put in its place: same weights and model to 1e-10, in float64 fits (the float32
    measurement vectors' own effect: tests/test_commit.py)."""
    from tractlens.app.io import load_dwi, load_tractogram
    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu import commit_host
    from tractlens.gpu.commit import CommitParams

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    tract = load_tractogram(demo_dir / "bundles.trk", reference=(dwi.affine, dwi.shape3))
    params = CommitParams(max_iter=40, tol=0.0)
    monkeypatch.setattr(commit_host, "CPU_FIT_DTYPE", np.float64)
    used = []
    real = commit_host.host_operator
    monkeypatch.setattr(commit_host, "host_operator", lambda p, **k: used.append(1) or real(p, **k))
    fast = commit_pipeline(dwi, tract, params=params, device="cpu")
    assert used
    monkeypatch.setattr(commit_host, "host_operator", lambda p, **k: NumpyOperator(p))
    reference = commit_pipeline(dwi, tract, params=params, device="cpu")
    assert fast.fit.iterations == reference.fit.iterations == 40
    assert _relative(fast.weights, reference.weights) < 1e-10
    np.testing.assert_allclose(fast.model, reference.model, rtol=1e-10, atol=1e-14)
