"""COMMIT's CPU fit with one visit of the voxel rows per iteration (gpu.commit_host.HostOperator.fused
and .step, gpu.commit_solver.fista_fused): no measurement-sized vector besides the signal. The
power iteration's product is the separate products' bit for bit; FISTA's step makes A x and A z
in float64 row by row, so the fit is a float64 FISTA's to rounding and a float32 one's to float32."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import MODELS, small_problem
from tractlens.gpu import commit_solver
from tractlens.gpu.commit_host import HostOperator

pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("threads", [1, 3])
def test_fused_products_equal_separate_ones(model, threads):
    problem, *_ = small_problem(seed=2, n_fibers=37, params=MODELS[model])
    op = HostOperator(problem, threads=threads)
    rng = np.random.default_rng(3)
    x, inv = rng.random(problem.n_cols), rng.random(problem.n_cols)
    # Aᵀ A (x · inv): the power iteration's product, bit for bit
    np.testing.assert_array_equal(op.fused(x, inv), op.at(op.a(x * inv)))
    # FISTA's step: ‖A x_new − y‖² and Aᵀ (A z − y) for z = x_new + β (x_new − x_old), all in float64
    y = rng.random(problem.n_rows * problem.n_meas).astype(np.float32)
    x_old, beta = rng.random(problem.n_cols), 0.37
    ax_new, ax_old = op.a(x * inv), op.a(x_old * inv)
    az = (1 + beta) * ax_new - beta * ax_old
    out = np.full(problem.n_cols, np.nan)
    residual2 = op.step(x, x_old, inv, y, beta, out=out)
    np.testing.assert_allclose(residual2, np.sum((ax_new - y) ** 2), rtol=1e-12)
    expected = op.at(az - y)
    np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-12 * np.abs(expected).max())
    # the last iteration: the residual only, nothing written
    untouched = np.full(problem.n_cols, np.nan)
    assert op.step(x, x_old, inv, y, beta, out=untouched, transpose=False) == pytest.approx(residual2, rel=1e-12)
    assert np.isnan(untouched).all()
    # the same thread count: the same values, bit for bit
    again = np.empty(problem.n_cols)
    assert op.step(x, x_old, inv, y, beta, out=again) == residual2
    np.testing.assert_array_equal(again, out)
    r0, r1 = 2, problem.n_rows - 1
    np.testing.assert_array_equal(op.a_rows(x, r0, r1), op.a(x).reshape(problem.n_rows, -1)[r0:r1])


@pytest.mark.parametrize(("lambda_", "tol", "max_iter"), [(0.0, 0.0, 25), (0.05, 1e-3, 400)])
def test_fused_fista_equals_a_float64_fista(lambda_, tol, max_iter):
    """The fused fit is FISTA with A x and A z in float64: a float64 :func:`fista`'s iterates to
    rounding, and a float32 one's to float32."""
    problem, *_ = small_problem(seed=4, n_fibers=45)
    op = HostOperator(problem, threads=3)
    y = (op.a(np.random.default_rng(5).random(problem.n_cols)) * 0.9).astype(np.float32)
    settings = dict(lambda_=lambda_, n_penalised=problem.n_ic_cols, max_iter=max_iter, tol=tol)
    fits = {
        dtype: commit_solver.fista(
            op.a, op.at, y, problem.n_cols, scale=op.column_norms(), dtype=dtype, writes_into=True, **settings
        )
        for dtype in (np.float64, np.float32)
    }
    new = commit_solver.fista_fused(op, y, problem.n_cols, scale=op.column_norms(), **settings)
    exact = fits[np.float64]
    assert new.iterations == exact.iterations and new.stopped == exact.stopped
    assert new.lipschitz == exact.lipschitz  # the power iteration: bit for bit
    np.testing.assert_allclose(new.objective, exact.objective, rtol=1e-10)
    np.testing.assert_allclose(new.x, exact.x, rtol=1e-8, atol=1e-10 * np.abs(exact.x).max())
    single = fits[np.float32]
    np.testing.assert_allclose(new.objective, single.objective, rtol=1e-5)
    np.testing.assert_allclose(new.x, single.x, rtol=1e-4, atol=1e-5 * np.abs(single.x).max())


def test_the_cpu_pipeline_fits_fused_with_the_same_weights_and_maps(demo_dir, monkeypatch):
    """The demo's CPU fit, fused and not: the same weights, objective and maps to float32 (the
    separate fit keeps A x and A z in float32); with the error maps made from blocks of rows of
    A x (no whole model kept) the fused fit's are its own bit for bit."""
    from tractlens.app.io import load_dwi, load_tractogram
    from tractlens.app.pipelines import commit as pipeline
    from tractlens.gpu.commit import CommitParams

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    tract = load_tractogram(demo_dir / "bundles.trk", reference=(dwi.affine, dwi.shape3))
    params = CommitParams(max_iter=30, tol=0.0)
    calls = []
    real = commit_solver.fista_fused
    monkeypatch.setattr(commit_solver, "fista_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    fused = pipeline.commit_pipeline(dwi, tract, params=params, device="cpu")
    assert calls and fused.model is not None
    monkeypatch.setattr(pipeline, "MODEL_HOST_BYTES", 0)  # the maps from blocks of rows
    blocks = pipeline.commit_pipeline(dwi, tract, params=params, device="cpu")
    assert blocks.model is None and blocks.errors is not None
    np.testing.assert_array_equal(blocks.weights, fused.weights)
    assert blocks.fit.objective == fused.fit.objective
    for key, volume in fused.maps().items():
        np.testing.assert_array_equal(blocks.maps()[key], volume, err_msg=key)
    monkeypatch.setattr(pipeline, "fused_fit", lambda op, dtype: False)
    separate = pipeline.commit_pipeline(dwi, tract, params=params, device="cpu")
    assert len(calls) == 2
    scale = np.abs(separate.weights).max()
    np.testing.assert_allclose(fused.weights, separate.weights, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(fused.fit.objective, separate.fit.objective, rtol=1e-5)
    for key, volume in separate.maps().items():
        np.testing.assert_allclose(fused.maps()[key], volume, rtol=1e-3, atol=1e-4 * max(np.abs(volume).max(), 1e-30),
                                   err_msg=key)  # fmt: skip
