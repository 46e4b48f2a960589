"""Shipped kernels on a real GPU (run on the GPU machine: pytest -m gpu tests/test_kernel_cache_gpu.py).

packaging/build_kernels.py builds the kernels of fit-dti (ours and CuPy's own) on the small
subject, and of CSD and fODF tracking on its 60-direction twin; then fit-dti runs in a fresh process with an EMPTY kernel cache, with CuPy imported
from another path (a link to it: CuPy's key names its header folder by path, so this is a user's
machine as far as the key goes), and must compile nothing: every file in its cache is one the
app installed from the build. Its FA equals the NumPy engine's (float32 fit: 1e-4 absolute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.slow]
#: What the build runs (packaging/build_kernels.py's labels): fit-dti on the small subject, CSD
#: (single-shell and multi-tissue) and fODF tracking on its 60-direction twin.
BUILT_COMMANDS = "fit-dti,fit-csd,fit-csd-msmt,track-fod"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    pytest.importorskip("cupy")
    work = tmp_path_factory.mktemp("kernels")
    out = work / "shipped"
    done = subprocess.run(
        [sys.executable, "packaging/build_kernels.py", "--measurements", "32", "--commands", BUILT_COMMANDS,
         "--out", str(out), "--work", str(work / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"out": out, "subject": work / "work" / "subject", "log": done.stdout}


def _cupy_elsewhere(tmp_path: Path) -> Path:
    """A folder where ``import cupy`` finds CuPy through a link (its __file__ then names this path)."""
    import cupy

    site = tmp_path / "site"
    site.mkdir()
    (site / "cupy").symlink_to(Path(cupy.__file__).parent, target_is_directory=True)
    return site


def _fit(subject: Path, out: Path, env: dict, device: str) -> subprocess.CompletedProcess:
    argv = ["fit-dti", str(subject / "dwi.nii"), "--mask", str(subject / "mask.nii.gz"), "-o", str(out)]
    return subprocess.run(
        [sys.executable, "-m", "tractlens.app.cli", *argv, "--device", device, "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_fresh_cache_with_the_shipped_build_compiles_nothing(built, tmp_path):
    tags = [p.name for p in built["out"].iterdir()]
    assert len(tags) == 1, tags  # this GPU's architecture
    site = _cupy_elsewhere(tmp_path)
    fresh = tmp_path / "fresh-cache"
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(fresh),
        "TRACTLENS_SHIPPED_KERNELS_DIR": str(built["out"]),
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = "import cupy, sys; sys.stdout.write(cupy.__file__)"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.startswith(
        str(site)
    )
    done = _fit(built["subject"], tmp_path / "gpu", env, "gpu")
    assert done.returncode == 0, done.stderr[-3000:]
    stamps = list(fresh.glob(".tractlens-shipped-*"))
    assert len(stamps) == 1
    installed = json.loads(stamps[0].read_text())["kernels"]
    files = [p for p in fresh.iterdir() if p.suffix == ".cubin"]
    assert installed > 0 and len(files) == installed, f"{len(files) - installed} kernels were compiled"

    cpu = _fit(built["subject"], tmp_path / "cpu", {**os.environ, "PYTHONPATH": str(ROOT)}, "cpu")
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    fa_gpu = nib.load(tmp_path / "gpu" / "dti_FA.nii.gz").get_fdata()
    fa_cpu = nib.load(tmp_path / "cpu" / "dti_FA.nii.gz").get_fdata()
    np.testing.assert_allclose(fa_gpu, fa_cpu, atol=1e-4)


def test_csd_and_fod_tracking_on_other_data_compile_nothing_with_the_shipped_build(built, tmp_path):
    """CSD and fODF tracking were built on the build's 60-direction subject; on the demo (another
    shape, another number of volumes) with an empty cache and CuPy under another path they must
    compile nothing, and the build's log shows both ran."""
    assert "fit-csd: ok" in built["log"] and "fit-csd-msmt: ok" in built["log"] and "track-fod: ok" in built["log"]
    site = _cupy_elsewhere(tmp_path)
    fresh = tmp_path / "fresh-cache"
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(fresh),
        "TRACTLENS_SHIPPED_KERNELS_DIR": str(built["out"]),
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cli = [sys.executable, "-m", "tractlens.app.cli"]
    demo = tmp_path / "demo"
    assert subprocess.run([*cli, "demo-data", str(demo)], cwd=ROOT, env=env, capture_output=True).returncode == 0
    fit = [*cli, "fit-csd", str(demo / "dwi.nii.gz"), "--mask", str(demo / "roi_arc_seed.nii.gz")]
    track = [
        *cli,
        "track",
        "fod-probabilistic",
        "--fod",
        str(tmp_path / "csd"),
        "--seed",
        str(demo / "roi_arc_seed.nii.gz"),
    ]
    for argv in ([*fit, "-o", str(tmp_path / "csd")], [*track, "-o", str(tmp_path / "fod.trk")]):
        done = subprocess.run(
            [*argv, "--device", "gpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
    installed = json.loads(next(fresh.glob(".tractlens-shipped-*")).read_text())["kernels"]
    files = [p for p in fresh.iterdir() if p.suffix == ".cubin"]
    assert len(files) == installed, f"{len(files) - installed} kernels were compiled"


def test_without_the_shipped_build_the_same_run_compiles(built, tmp_path):
    """The twin: the same fresh process with the shipped kernels off compiles (so the test above
    can fail)."""
    fresh = tmp_path / "fresh-cache"
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(fresh),
        "TRACTLENS_SHIPPED_KERNELS": "0",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    done = _fit(built["subject"], tmp_path / "gpu", env, "gpu")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(fresh.glob(".tractlens-shipped-*"))
    assert len([p for p in fresh.iterdir() if p.suffix == ".cubin"]) > 0


def test_after_the_rehearsal_fit_dti_and_tracking_on_other_data_compile_nothing(built, tmp_path):
    """Where no shipped build matches (turned off here), the rehearsal on the demo leaves CuPy's
    cache holding what fit-dti and deterministic tracking compile on another subject (the
    benchmark's small one: other shape, other number of volumes)."""
    fresh = tmp_path / "fresh-cache"
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(fresh),
        "TRACTLENS_SHIPPED_KERNELS": "0",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    code = (
        "import json; from tractlens.app import rehearsal; from tractlens.gpu import backend; "
        "ok, gpu = backend.gpu_status(); assert ok, gpu; print(json.dumps(rehearsal.rehearse(gpu)))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == [] and len(result["ran"]) == 8, result
    before = {p.name for p in fresh.iterdir() if p.suffix == ".cubin"}
    assert _fit(built["subject"], tmp_path / "dti", env, "gpu").returncode == 0
    track = ["track", "deterministic", "--tensor", str(tmp_path / "dti"), "--whole-brain"]
    track += ["--mask", str(built["subject"] / "mask.nii.gz"), "-o", str(tmp_path / "t.trk"), "--device", "gpu"]
    done = subprocess.run([sys.executable, "-m", "tractlens.app.cli", *track], cwd=ROOT, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    new = {p.name for p in fresh.iterdir() if p.suffix == ".cubin"} - before
    assert not new, f"{len(new)} kernels compiled after the rehearsal"


def test_cupys_own_compiler_finds_the_relocated_keys_of_a_cupy_elsewhere():
    """The same round trip through CuPy's real compile_with_cache (its -I options of CuPy's and
    CUDA's headers) without running a kernel: tests/benchmarks/kernel_keys_without_gpu.py builds two
    kernels, then a process with CuPy under another path must find both after the install and
    compile both without it."""
    pytest.importorskip("cupy")
    done = subprocess.run(
        [sys.executable, "tests/benchmarks/kernel_keys_without_gpu.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("RESULT PASS") == 3, done.stdout
