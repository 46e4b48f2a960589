"""COMMIT's compact CPU engine (gpu.commit_host): equal to the NumPy reference, with numba's
compiled loops and with the NumPy fallback, on one thread and on several."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import MODELS, scheme, small_problem
from tractlens.gpu import host
from tractlens.gpu.commit import lookup_tables
from tractlens.gpu.commit_host import HostOperator, host_operator_bytes
from tractlens.gpu.commit_operator import apply_a_numpy, apply_at_numpy, column_norms
from tractlens.gpu.commit_segments import Segments


def _relative(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


@pytest.fixture(params=["numba", "numpy"])
def engine(request, monkeypatch):
    """The compiled loops (the cpu extra) and the NumPy fallback without them."""
    if request.param == "numba":
        pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    else:
        monkeypatch.setenv("TRACTLENS_DISABLE_NUMBA", "1")
    host.numba_module.cache_clear()
    yield request.param
    host.numba_module.cache_clear()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_host_operator_equals_the_reference(engine, model, threads, seed):
    """A x, Aᵀ y and the column norms within 1e-12 relative of the NumPy reference (float64
    sums in another order), on problems with an empty voxel row and a streamline without
    segments; <Ax, y> = <x, Aᵀy>."""
    problem, *_ = small_problem(seed=seed, n_fibers=40 + seed, params=MODELS[model])
    tables = lookup_tables(*scheme(np.random.default_rng(seed), 30 + 20 * seed), MODELS[model])
    problem.lut_ic, problem.lut_ec, problem.lut_iso = tables["ic"], tables["ec"], tables["iso"]
    seg = problem.segments
    keep = seg.fiber != 3
    problem.segments = Segments(seg.row[keep], seg.fiber[keep], seg.length[keep], seg.orient[keep], seg.n_fibers)
    assert (np.bincount(problem.segments.row, minlength=problem.n_rows) == 0).any()
    op = HostOperator(problem, threads=threads)
    assert op.compiled == (engine == "numba")
    rng = np.random.default_rng(10 + seed)
    x = rng.random(problem.n_cols)
    y = rng.random(problem.n_rows * problem.n_meas)
    ax, aty = op.a(x), op.at(y)
    assert ax.shape == (problem.n_rows * problem.n_meas,) and aty.shape == (problem.n_cols,)
    assert _relative(ax, apply_a_numpy(problem, x).ravel()) < 1e-12
    np.testing.assert_allclose(aty, apply_at_numpy(problem, y), rtol=1e-12, atol=1e-13 * np.abs(aty).max())
    norms = op.column_norms()
    np.testing.assert_allclose(norms, column_norms(problem), rtol=1e-12)
    assert norms[3 :: problem.n_fibers][: problem.n_ic].max() == 0.0
    lhs, rhs = float(ax @ y), float(x @ aty)
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_norms_group_a_streamline_whose_segments_are_apart_in_its_row(engine):
    """A row whose segments are not grouped by streamline (synthetic problems, other builders):
    the norms still sum each streamline's response in the voxel before squaring."""
    lut = np.random.default_rng(0).random((1, 32761, 5)).astype(np.float32)
    seg = Segments(
        np.array([0, 0, 0, 1], np.int32),
        np.array([1, 0, 1, 1], np.int32),
        np.array([0.5, 1.0, 0.25, 2.0]),
        np.array([7, 8, 9, 9], np.uint16),
        2,
    )
    from tractlens.gpu.commit_operator import Problem

    problem = Problem(2, seg, np.array([0, 1], np.int32), np.array([7, 9], np.int32), lut, lut[0], lut[0, :2])
    np.testing.assert_allclose(HostOperator(problem, threads=2).column_norms(), column_norms(problem), rtol=1e-12)


def test_operator_memory_has_nothing_per_segment():
    """What building the operator and its products allocate (tracemalloc's peak, the result
    vectors included) does not grow with the segments: 50× the segments, the same bytes to
    within 1 per added segment (one thread: with several, how many scratch buffers are alive
    at once depends on timing)."""
    import tracemalloc

    pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    problem, *_ = small_problem(seed=0)
    x = np.random.default_rng(0).random(problem.n_cols)
    y = np.random.default_rng(1).random(problem.n_rows * problem.n_meas)

    def peak(p):
        tracemalloc.start()
        op = HostOperator(p, threads=1)
        op.a(x), op.at(y), op.column_norms()
        out = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return out

    peak(problem)  # numba's compilation and caches out of the way
    small = peak(problem)
    seg = problem.segments
    problem.segments = Segments(
        np.repeat(seg.row, 50), np.repeat(seg.fiber, 50), np.repeat(seg.length, 50), np.repeat(seg.orient, 50),
        seg.n_fibers,
    )  # fmt: skip
    assert peak(problem) - small < 49 * len(seg)
    assert host_operator_bytes(problem.n_rows, problem.n_fibers, problem.n_ic, problem.n_meas, 2) > 0


@pytest.mark.parametrize("threads", [1, 3])
def test_products_into_given_vectors_and_float32_measurements(engine, threads):
    """``a(x, out=)`` writes A x into a float64 or float32 vector (summed in float64, each value
    rounded once: within float32's half unit of the float64 product) and allocates no result;
    ``at(y, out=)`` takes float32 measurements as they are (widened per value: equal to Aᵀ of the
    same values in float64 to 1e-12) and overwrites what ``out`` held."""
    problem, *_ = small_problem(seed=1, n_fibers=41)
    op = HostOperator(problem, threads=threads)
    rng = np.random.default_rng(7)
    x = rng.random(problem.n_cols)
    exact = op.a(x)
    out64 = np.full(problem.n_rows * problem.n_meas, np.nan)
    assert op.a(x, out=out64) is out64
    np.testing.assert_array_equal(out64, exact)
    out32 = np.full(problem.n_rows * problem.n_meas, np.nan, dtype=np.float32)
    assert op.a(x, out=out32) is out32
    np.testing.assert_array_equal(out32, exact.astype(np.float32))  # rounded once, from the float64 sum
    y32 = rng.random(problem.n_rows * problem.n_meas).astype(np.float32)
    into = np.full(problem.n_cols, 5.0)
    assert op.at(y32, out=into) is into
    np.testing.assert_allclose(into, apply_at_numpy(problem, y32.astype(np.float64)), rtol=1e-12,
                               atol=1e-13 * np.abs(into).max())  # fmt: skip
    with pytest.raises(ValueError, match="contiguous float64 or float32"):
        op.a(x, out=np.zeros(problem.n_rows * problem.n_meas, dtype=np.int32))
