"""COMMIT's CPU fit with one visit of the voxel rows per iteration (gpu.commit_host.HostOperator.fused,
gpu.commit_solver.fista_fused): the same iterates, objective, stop and error maps as the fit made of
separate A and Aᵀ products, bit for bit, with one measurement-sized vector besides the signal."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import MODELS, small_problem
from tractlens.gpu import commit_solver
from tractlens.gpu.commit_host import HostOperator

pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("threads", [1, 3])
def test_fused_products_equal_separate_ones_bit_for_bit(model, threads):
    problem, *_ = small_problem(seed=2, n_fibers=37, params=MODELS[model])
    op = HostOperator(problem, threads=threads)
    rng = np.random.default_rng(3)
    x, inv = rng.random(problem.n_cols), rng.random(problem.n_cols)
    # Aᵀ A (x · inv): the power iteration's product
    np.testing.assert_array_equal(op.fused(x, inv), op.at(op.a(x * inv)))
    # FISTA's step: A x_new over A x, and Aᵀ (A z − y) for A z = (A x − A x_new)(−β) + A x_new
    y = rng.random(problem.n_rows * problem.n_meas).astype(np.float32)
    ax_old = op.a(rng.random(problem.n_cols), out=np.empty_like(y))
    ax_new = op.a(x * inv, out=np.empty_like(y))
    az = ax_old - ax_new
    az *= np.float64(-0.37)  # FISTA's β is a NumPy float64
    az += ax_new
    az -= y
    ax = ax_old.copy()
    out = np.full(problem.n_cols, np.nan)
    assert op.fused(x, inv, out=out, ax=ax, y=y, neg_beta=-0.37) is out
    np.testing.assert_array_equal(ax, ax_new)
    np.testing.assert_array_equal(out, op.at(az))
    ax = ax_old.copy()
    op.fused(x, inv, ax=ax, transpose=False)  # A x_new only
    np.testing.assert_array_equal(ax, ax_new)
    r0, r1 = 2, problem.n_rows - 1
    np.testing.assert_array_equal(op.a_rows(x, r0, r1), op.a(x).reshape(problem.n_rows, -1)[r0:r1])


@pytest.mark.parametrize(("lambda_", "tol", "max_iter"), [(0.0, 0.0, 25), (0.05, 1e-3, 400)])
def test_fused_fista_equals_fista_bit_for_bit(lambda_, tol, max_iter):
    problem, *_ = small_problem(seed=4, n_fibers=45)
    op = HostOperator(problem, threads=3)
    y = (op.a(np.random.default_rng(5).random(problem.n_cols)) * 0.9).astype(np.float32)
    settings = dict(lambda_=lambda_, n_penalised=problem.n_ic_cols, max_iter=max_iter, tol=tol)
    old = commit_solver.fista(op.a, op.at, y, problem.n_cols, scale=op.column_norms(), dtype=np.float32,
                              writes_into=True, **settings)  # fmt: skip
    new = commit_solver.fista_fused(op, y, problem.n_cols, scale=op.column_norms(), **settings)
    assert new.iterations == old.iterations and new.stopped == old.stopped
    assert new.lipschitz == old.lipschitz
    assert new.objective == old.objective
    np.testing.assert_array_equal(new.x, old.x)


def test_the_cpu_pipeline_fits_fused_with_the_same_weights_and_maps(demo_dir, monkeypatch):
    """The demo's CPU fit, fused and not: equal weights, objective and maps; with the error maps
    made from blocks of rows of A x (no whole model kept) they are the same too."""
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
    monkeypatch.setattr(pipeline, "fused_fit", lambda op, dtype: False)
    separate = pipeline.commit_pipeline(dwi, tract, params=params, device="cpu")
    assert len(calls) == 2
    for result in (fused, blocks):
        np.testing.assert_array_equal(result.weights, separate.weights)
        assert result.fit.objective == separate.fit.objective
        for key, volume in separate.maps().items():
            np.testing.assert_array_equal(result.maps()[key], volume, err_msg=key)
