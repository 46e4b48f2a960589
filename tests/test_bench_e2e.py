"""The whole-command benchmark (tests/benchmarks/bench_e2e.py) runs end to end on the CPU, and
its synthetic subject is the same bytes for the same seed (any number of threads)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "benchmarks" / "bench_e2e.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_e2e"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_e2e", None)


def tiny(bench, **changes):
    """A subject of a few hundred voxels: 2 b=0 + 2 shells × 4 directions, 3 samples."""
    spec = bench.SubjectSpec(
        shape=(10, 12, 10), shells=(1000.0, 2000.0), per_shell=4, n_b0=2, semi_axes=(4.0, 5.0, 4.0), seed_side=2
    )
    return replace(spec, n_samples=3, **changes)


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "subject.json"
    }


def test_the_subject_is_the_same_bytes_for_the_same_seed(bench, tmp_path):
    spec = tiny(bench)
    bench.make_subject(spec, tmp_path / "a", [1.0, 0.5], workers=1)
    bench.make_subject(spec, tmp_path / "b", [1.0, 0.5], workers=3)
    first = digests(tmp_path / "a")
    assert {"dwi.nii", "dwi.bval", "dwi.bvec", "mask.nii.gz", "seed.nii.gz", "mask_s0.5.nii.gz"} <= set(first)
    assert "bedpostx/merged_th3samples.nii.gz" in first
    assert first == digests(tmp_path / "b")
    bench.make_subject(replace(spec, seed=spec.seed + 1), tmp_path / "c", [1.0], workers=1)
    other = digests(tmp_path / "c")
    assert other["dwi.nii"] != first["dwi.nii"]  # the seed matters


def test_the_subject_reads_back_as_tractlens_inputs(bench, tmp_path):
    from tractlens.app.io import load_bedpostx, load_dwi

    spec = tiny(bench)
    manifest = bench.make_subject(spec, tmp_path, [1.0, 0.5], workers=2)
    dwi = load_dwi(tmp_path / "dwi.nii")
    mask = bench.brain_mask(spec)
    assert dwi.data.shape == (*spec.shape, spec.n_volumes)
    assert np.count_nonzero(dwi.bvals == 0) == spec.n_b0
    assert np.allclose(np.linalg.norm(dwi.bvecs[dwi.bvals > 0], axis=1), 1.0, atol=1e-6)
    assert manifest["brain_voxels"] == int(mask.sum())
    b0 = dwi.data[..., dwi.bvals == 0].mean(axis=-1)
    assert np.median(b0[mask]) == pytest.approx(bench.S0, rel=0.1)  # Rician noise at SNR 25
    assert np.median(b0[~mask]) < 0.1 * bench.S0
    samples = load_bedpostx(tmp_path / "bedpostx")
    assert samples.theta.shape == (*spec.shape, 3, spec.n_samples)
    assert np.array_equal(samples.mask, mask)
    f = samples.f[mask].mean(axis=-1)  # (n, 3): sorted, largest first, 0.7 at most in all
    assert np.all(np.diff(f, axis=1) <= 0.05)  # the sample noise: 5 % of a fraction
    assert np.all(f.sum(axis=1) < 0.8) and f[:, 0].min() > 0.2
    half = np.asarray(nib.load(tmp_path / "mask_s0.5.nii.gz").dataobj) > 0
    assert not (half & ~mask).any() and 0.35 < half.sum() / mask.sum() < 0.65


def test_the_hcp_subject_has_the_issue_size(bench):
    spec = bench.SubjectSpec()
    assert spec.n_volumes == 288 and spec.shape == (145, 174, 145) and spec.voxel_mm == 1.25
    assert 4 / 3 * np.pi * np.prod(spec.semi_axes) == pytest.approx(1.02e6, rel=0.01)
    assert (bench.seed_roi(spec) & bench.brain_mask(spec)).sum() == 216  # all inside the brain


def test_quick_fit_dti_runs_end_to_end_and_reports_every_field(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRACTLENS_TIMINGS", None)
    results = tmp_path / "results"
    argv = [sys.executable, str(SCRIPT), "--quick", "--commands", "fit-dti", "--device", "cpu"]
    argv += ["--outdir", str(tmp_path / "e2e"), "--results", str(results), "--tag", "check", "--workers", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = json.loads((results / "e2e_check.json").read_text())
    row = out["runs"]["fit-dti@1"]
    assert row["exit_status"] == 0 and not row["timed_out"]
    for key in ("wall_s", "host_peak_bytes", "read_s", "compute_s", "write_s", "gpu_work_s", "units"):
        assert isinstance(row[key], int | float) and row[key] > 0, key
    assert row["units"] == out["subject"]["brain_voxels"]
    assert row["read_s"] + row["compute_s"] + row["write_s"] < row["wall_s"]
    assert row["host_peak_bytes"] > 20e6  # an interpreter with NumPy at least
    assert "device_peak_smi_bytes" in row and "device_pool_peak_bytes" in row
    table = (results / "e2e_check.md").read_text()
    assert "| fit-dti | 1 |" in table
    assert (tmp_path / "e2e" / "runs" / "fit-dti_s1" / "dti_FA.nii.gz").exists()


def test_the_small_subject_is_unlike_those_the_kernels_are_built_on(bench, build_kernels):
    """--small (first_run_on_gpu.sh quick) measures a first run on data no shipped kernel was built
    on: another shape and another count of volumes than the build's subjects and the demo."""
    from tractlens.app import demo

    small = bench.SMALL
    assert small.n_volumes == 65 and small.shape == (48, 56, 48) and small.voxel_mm == 2.0
    built_on = {(bench.QUICK.shape, bench.QUICK.n_volumes), (demo.SHAPE, 68)}
    built_on.add((bench.QUICK.shape, bench.QUICK.n_b0 + build_kernels.CSD_DIRECTIONS * len(bench.QUICK.shells)))
    assert all(small.shape != shape and small.n_volumes != n for shape, n in built_on)
    assert (bench.seed_roi(small) & bench.brain_mask(small)).sum() == 64


def test_the_cold_runs_name_the_kernels_cupy_compiled(bench, tmp_path):
    """CuPy (CUPY_CACHE_SAVE_CUDA_SOURCE=1) writes ``<hash>.cubin.cu`` beside each kernel it
    compiles; a kernel the app installed from the shipped build has no source."""
    cache = tmp_path / "cupy"
    cache.mkdir()
    (cache / "aa.cubin").write_bytes(b"\0")
    (cache / "aa.cubin.cu").write_text('extern "C" __global__ void __launch_bounds__(512) cupy_sum_pass1(int n) {}')
    (cache / "bb.cubin").write_bytes(b"\0")  # installed: no source
    (cache / "cc.cubin").write_bytes(b"\0")
    (cache / "cc.cubin.cu").write_text(
        "typedef float real;\n__device__ int f();\n__global__ void track_fod(float* x) {}"
    )
    assert bench.compiled_kernel_names(cache) == ["cupy_sum_pass1", "track_fod"]
    assert bench.compiled_kernel_names(tmp_path / "absent") == []


def test_the_first_run_summary_gives_each_commands_line_ratio_and_verdict(bench, tmp_path):
    shipped = tmp_path / "shipped"
    (shipped / "cupy14.2.0-nvrtc13.0-sm90").mkdir(parents=True)

    def row(argv, cold, warm, names):
        return {"argv": ["tractlens", *argv], "exit_status": 0, "cold_s": cold, "warm_s": warm,
                "cold_over_warm": cold / warm, "kernels_compiled_cold": len(names),
                "kernels_compiled_cold_names": names}  # fmt: skip

    results = {
        "device": "h100_small",
        "subject_summary": "48×56×48 voxels",
        "runs": {
            "fit-dti@1": row(["fit-dti", "dwi.nii", "--device", "gpu"], 3.3, 3.0, []),
            "commit@1": row(["commit", "--dwi", "dwi.nii", "--device", "gpu"], 6.0, 4.0, ["cupy_sum"]),
            "track-det@1": {"argv": ["tractlens", "track"], "exit_status": 0, "wall_s": 1.0},  # not a cold run
        },
    }
    env = {"CUPY_CACHE_DIR": str(tmp_path / "cupy"), "TRACTLENS_SHIPPED_KERNELS_DIR": str(shipped)}
    summary = bench.first_run_summary(results, results["runs"], env)
    assert list(summary["commands"]) == ["commit@1", "fit-dti@1"] and not summary["met"]
    fit, commit = summary["commands"]["fit-dti@1"], summary["commands"]["commit@1"]
    assert fit["command_line"] == "tractlens fit-dti dwi.nii --device gpu --json --quiet"
    assert fit["cold_over_warm"] == 1.1 and fit["within_target"]
    assert commit["cold_over_warm"] == 1.5 and not commit["within_target"]
    assert commit["kernels_compiled_cold_names"] == ["cupy_sum"]
    assert summary["shipped_builds"] == ["cupy14.2.0-nvrtc13.0-sm90"]
    assert fit["cold_vs_warm"] == {"cold": {}, "warm": {}}  # runs without the command's timings
    del results["runs"]["commit@1"]
    assert bench.first_run_summary(results, results["runs"], env)["met"]
    # with them: where the cold run's extra seconds went (start-up, phases, GPU warm-up stages)
    timings = {
        "total_s": 1.2,
        "phases_s": {"read": 0.04},
        "details_s": {"gpu_warmup": {"shipped_kernels_install": 0.31}},
    }
    results["runs"]["fit-dti@1"].update(wall_s=3.0, timings={**timings, "total_s": 1.0, "details_s": {}})
    results["runs"]["fit-dti@1"]["first_run"] = {"wall_s": 3.3, "timings": timings}
    where = bench.first_run_summary(results, results["runs"], env)["commands"]["fit-dti@1"]["cold_vs_warm"]
    assert where["cold"] == {
        "startup_s": 2.1,
        "phases_s": {"read": 0.04},
        "gpu_warmup_s": {"shipped_kernels_install": 0.31},
    }
    assert where["warm"] == {"startup_s": 2.0, "phases_s": {"read": 0.04}, "gpu_warmup_s": {}}


def test_cold_pairs_give_the_median_cold_and_warm_and_record_every_pair(tmp_path):
    """--cold --cold-pairs 3: three (cold, warm) pairs, each cold run from emptied caches; the
    command's cold and warm times are the medians, every pair is kept (a 2-3 s command varies by
    ~0.5 s between fresh processes: one pair cannot tell 1.2 x from noise)."""
    import statistics

    inherited = tmp_path / "inherited-cache"  # a cache the environment hands down: not the run's to empty
    (inherited / "kept").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACTLENS_CACHE": str(inherited)}
    env.pop("TRACTLENS_TIMINGS", None)
    results = tmp_path / "results"
    argv = [sys.executable, str(SCRIPT), "--quick", "--commands", "fit-dti", "--device", "cpu", "--cold"]
    argv += ["--cold-pairs", "3", "--outdir", str(tmp_path / "e2e"), "--results", str(results), "--tag", "pairs"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    row = json.loads((results / "e2e_pairs.json").read_text())["runs"]["fit-dti@1"]
    pairs = row["cold_pairs_s"]
    assert len(pairs) == 3 and all(cold > 0 and warm > 0 for cold, warm in pairs)
    assert row["cold_s"] == pytest.approx(statistics.median(cold for cold, _ in pairs), abs=1e-3)
    assert row["warm_s"] == pytest.approx(statistics.median(warm for _, warm in pairs), abs=1e-3)
    assert row["cold_over_warm"] == pytest.approx(row["cold_s"] / row["warm_s"], rel=1e-3)
    assert (inherited / "kept").is_dir()  # the suite's own cache, which emptying it removed mid-run
