"""COMMIT's operator split by voxel rows across devices (gpu.commit_multi): on simulated GPUs
(NumPy backends, the code path of real ones) A x, Aᵀ y and the column norms equal the whole
operator's to float64 rounding (the IC part of Aᵀ y is a sum over devices), the fitted weights
equal one device's within float32, and a failing device is named. On real GPUs (gpu marker):
two blocks on one GPU, and every GPU, against the NumPy reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.test_commit import small_problem
from tractlens.gpu.backend import get_backend, gpu_backends
from tractlens.gpu.commit_multi import SplitOperator, balanced_row_ranges
from tractlens.gpu.commit_operator import NumpyOperator
from tractlens.gpu.commit_solver import fista
from tractlens.gpu.multidevice import DeviceFailure, simulated_backends

#: Weights "within float32": relative to the largest weight
FLOAT32 = float(np.finfo(np.float32).eps)


def _fit(op, problem, y, xp=np):
    scale = op.column_norms()
    return fista(op.a, op.at, xp.asarray(y), problem.n_cols, scale=scale, n_penalised=problem.n_ic_cols,
                 max_iter=200, tol=1e-6, xp=xp).x  # fmt: skip


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_row_ranges_cover_every_row_once_with_balanced_segments(parts):
    problem = small_problem(n_fibers=60)[0]
    ranges = balanced_row_ranges(problem, parts)
    assert ranges[0][0] == 0 and ranges[-1][1] == problem.n_rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    counts = np.diff(np.searchsorted(problem.segments.row, [r for r, _ in ranges] + [problem.n_rows]))
    assert counts.max() - counts.min() <= 0.35 * counts.mean()


def test_the_split_products_equal_the_whole_operator():
    problem = small_problem(n_fibers=60)[0]
    rng = np.random.default_rng(1)
    whole = NumpyOperator(problem)
    split = SplitOperator(simulated_backends(3), problem)
    x = rng.random(problem.n_cols)
    y = rng.random(problem.n_rows * problem.n_meas)
    np.testing.assert_allclose(split.a(x), whole.a(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(split.at(y), whole.at(y), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(split.column_norms(), whole.column_norms(), rtol=1e-12)
    assert sum(split.segments) == len(problem.segments) and len(split) == 3


def test_the_fitted_weights_equal_one_devices_within_float32():
    problem = small_problem(n_fibers=60)[0]
    rng = np.random.default_rng(2)
    y = NumpyOperator(problem).a(rng.random(problem.n_cols)) + rng.normal(0, 0.01, problem.n_rows * problem.n_meas)
    one = _fit(NumpyOperator(problem), problem, y)
    split = _fit(SplitOperator(simulated_backends(4), problem), problem, y)
    np.testing.assert_allclose(split, one, rtol=0, atol=FLOAT32 * np.abs(one).max())


def test_a_device_failing_while_applying_is_named():
    problem = small_problem(n_fibers=30)[0]
    op = SplitOperator(simulated_backends(3), problem)

    class Broken:
        def a(self, x):
            raise MemoryError("injected")

    op.ops[2] = Broken()
    with pytest.raises(DeviceFailure, match=r"^GPU 2 \(simulated on the CPU\): out of memory while computing A x$"):
        op.a(np.ones(problem.n_cols))


@pytest.mark.gpu
@pytest.mark.parametrize("shares", ["two on one GPU", "every GPU"])
def test_the_gpu_split_fits_what_numpy_fits(shares):
    """A x and Aᵀ y within 1e-9 relative of the NumPy reference, the weights within float32."""
    import cupy

    problem = small_problem(n_fibers=60)[0]
    rng = np.random.default_rng(3)
    gpu = get_backend("gpu")
    backends = [gpu, gpu] if shares == "two on one GPU" else gpu_backends()
    whole = NumpyOperator(problem)
    split = SplitOperator(backends, problem)
    x = rng.random(problem.n_cols)
    yv = rng.random(problem.n_rows * problem.n_meas)
    np.testing.assert_allclose(cupy.asnumpy(split.a(cupy.asarray(x))), whole.a(x), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(split.at(cupy.asarray(yv))), whole.at(yv), rtol=1e-9, atol=1e-12)
    y = whole.a(rng.random(problem.n_cols))
    one = _fit(whole, problem, y)
    got = cupy.asnumpy(_fit(split, problem, y, xp=cupy))
    np.testing.assert_allclose(got, one, rtol=0, atol=FLOAT32 * np.abs(one).max())


def test_the_command_splits_the_operator_over_simulated_gpus(demo_dir, tmp_path, monkeypatch, capsys):
    """``commit --gpus 3`` (simulated GPUs): the same weights as one device within float32, the
    split in the summary."""
    import json

    from tractlens.app.cli import main
    from tractlens.app.pipelines import commit as commit_pipeline

    monkeypatch.setattr(commit_pipeline, "gpu_backends", lambda n: simulated_backends(n))
    base = ["commit", "--dwi", str(demo_dir / "dwi.nii.gz"), "--tractogram", str(demo_dir / "bundles.trk"),
            "--max-iter", "30", "--json", "--quiet"]  # fmt: skip
    assert main([*base, "--device", "cpu", "-o", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    assert main([*base, "--gpus", "3", "-o", str(tmp_path / "three")]) == 0
    summary = json.loads(capsys.readouterr().out)
    one = np.loadtxt(tmp_path / "one" / "streamline_weights.txt")
    three = np.loadtxt(tmp_path / "three" / "streamline_weights.txt")
    np.testing.assert_allclose(three, one, rtol=0, atol=FLOAT32 * np.abs(one).max())
    assert summary["gpus"] == 3 and len(summary["segments_per_device"]) == 3


def test_gpus_with_the_cpu_device_is_refused(demo_dir, tmp_path, capsys):
    from tractlens.app.cli import main

    args = ["commit", "--dwi", str(demo_dir / "dwi.nii.gz"), "--tractogram", str(demo_dir / "bundles.trk")]
    assert main([*args, "--gpus", "2", "--device", "cpu", "-o", str(tmp_path / "o")]) == 2
    assert "--gpus with --device cpu" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_gpu_failing_during_the_fit_stops_the_command_with_its_name_and_no_files(demo_dir, tmp_path, monkeypatch,
                                                                                     capsys):  # fmt: skip
    from tractlens.app.cli import main
    from tractlens.app.pipelines import commit as commit_pipeline
    from tractlens.gpu import commit_multi

    make = commit_multi.SplitOperator._make

    class Lost:
        def __init__(self, op):
            self.op = op

        def column_norms(self):
            return self.op.column_norms()

        def a(self, x):
            raise RuntimeError("cudaErrorDevicesUnavailable: device lost (injected)")

        at = a

    def losing(self, backend, sub):
        op = make(self, backend, sub)
        return Lost(op) if backend.device_id == 1 else op

    monkeypatch.setattr(commit_pipeline, "gpu_backends", lambda n: simulated_backends(n))
    monkeypatch.setattr(commit_multi.SplitOperator, "_make", losing)
    out = tmp_path / "o"
    args = ["commit", "--dwi", str(demo_dir / "dwi.nii.gz"), "--tractogram", str(demo_dir / "bundles.trk")]
    assert main([*args, "--gpus", "3", "--max-iter", "5", "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        "GPU 1 (simulated on the CPU): RuntimeError: cudaErrorDevicesUnavailable: device lost (injected) while" in err
    )
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.gpu
def test_the_commit_use_case_on_gpus_equals_one_gpu_within_float32(demo_dir, monkeypatch):
    """``commit_from_files(gpus=2)``: every GPU when there are several, else two blocks on one."""
    from tractlens.app.pipelines import commit as commit_pipeline
    from tractlens.app.usecases.commit import commit_from_files
    from tractlens.gpu.backend import gpu_count

    files = (demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    params = commit_pipeline.CommitParams(max_iter=50)
    one, _ = commit_from_files(*files, params=params, device="gpu")
    n = max(2, gpu_count())
    if gpu_count() < 2:
        gpu = get_backend("gpu")
        monkeypatch.setattr(commit_pipeline, "gpu_backends", lambda k: [gpu] * k)
    split, _ = commit_from_files(*files, params=params, gpus=n)
    w1, wn = one.weights, split.weights
    np.testing.assert_allclose(wn, w1, rtol=0, atol=FLOAT32 * np.abs(w1).max())
    assert split.provenance["gpus"] == n and split.provenance["s_per_iteration"] > 0
