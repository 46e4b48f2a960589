"""Shipped kernels on a real GPU (run on the GPU machine: pytest -m gpu tests/test_kernel_cache_gpu.py).

packaging/build_kernels.py builds the kernels of fit-dti (ours and CuPy's own) on the small
subject, and of CSD and fODF tracking on its 60-direction twin; then fit-dti runs in a fresh process with an EMPTY kernel cache, with CuPy imported
from another path (a link to it: CuPy's key names its header folder by path, so this is a user's
machine as far as the key goes), and must compile nothing: every file in its cache is one the
app installed from the build. Its FA equals the NumPy engine's (float32 fit: 1e-4 absolute).

Every process here runs with ``CUPY_CACHE_SAVE_CUDA_SOURCE=1``: CuPy then writes each kernel it
compiles beside its file, so a failure names the kernels that were compiled (not only how many).
``TRACTLENS_TEST_KERNEL_BUILD=DIR`` reuses a build made by ``tests/benchmarks/first_run_on_gpu.sh
quick`` (``DIR/shipped``, ``DIR/work/subject``, ``DIR/build.log``) instead of building one here."""

from __future__ import annotations

import json
import os
import re
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


#: Names a build made beforehand (see the module's docstring).
ENV_BUILD = "TRACTLENS_TEST_KERNEL_BUILD"
_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    pytest.importorskip("cupy")
    if os.environ.get(ENV_BUILD):
        made = Path(os.environ[ENV_BUILD])
        return {"out": made / "shipped", "subject": made / "work" / "subject", "log": (made / "build.log").read_text()}
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


def _env(cache: Path, **extra) -> dict:
    """This process's environment with an empty CuPy cache at ``cache`` that keeps the source of
    every kernel CuPy compiles (``<file>.cu``), and ``extra``."""
    return {
        **os.environ,
        "CUPY_CACHE_DIR": str(cache),
        "CUPY_CACHE_SAVE_CUDA_SOURCE": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **extra,
    }


def _cubins(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.suffix == ".cubin"} if cache.is_dir() else set()


def compiled_names(cache: Path, files) -> list[str]:
    """The kernels in CuPy's saved sources of the cache ``files`` (``?`` where no source was kept)."""
    names = []
    for name in sorted(files):
        source = cache / f"{name}.cu"
        found = _KERNEL.findall(source.read_text(errors="replace")) if source.exists() else []
        names.append(found[-1] if found else "?")
    return names


def _compiled_here(cache: Path) -> list[str]:
    """The kernels CuPy compiled into ``cache`` (those with a saved source; installed ones have none)."""
    return compiled_names(cache, [f for f in _cubins(cache) if (cache / f"{f}.cu").exists()])


def _compiled_by(argv: list[str], env: dict) -> list[str]:
    """Run ``tractlens argv``; the kernels it compiled into ``env``'s cache."""
    cache = Path(env["CUPY_CACHE_DIR"])
    before = _cubins(cache)
    done = subprocess.run(
        [sys.executable, "-m", "tractlens.app.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{argv[:2]}: {done.stderr[-3000:]}"
    return compiled_names(cache, _cubins(cache) - before)


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
        "CUPY_CACHE_SAVE_CUDA_SOURCE": "1",  # the kernels CuPy compiles keep their source: named below
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
    assert installed > 0 and len(files) == installed, f"compiled: {_compiled_here(fresh)}"

    # the NumPy reference: this process's environment (its PYTHONPATH too: nibabel may live there),
    # with the repository first, as every other process here
    cpu_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cpu = _fit(built["subject"], tmp_path / "cpu", cpu_env, "cpu")
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
        "CUPY_CACHE_SAVE_CUDA_SOURCE": "1",  # the kernels CuPy compiles keep their source: named below
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
    assert len(files) == installed, f"compiled: {_compiled_here(fresh)}"


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


@pytest.fixture(scope="module")
def other_subject(tmp_path_factory) -> Path:
    """The benchmark's small subject (24×28×24 voxels, 32 volumes; the demo: 56×56×24, 68), made
    here so the rehearsal's test needs no kernel build."""
    pytest.importorskip("cupy")
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    import bench_e2e

    folder = tmp_path_factory.mktemp("other-subject")
    bench_e2e.make_subject(bench_e2e.QUICK, folder, [1.0], workers=os.cpu_count() or 1)
    return folder


def test_after_the_rehearsal_fit_dti_and_tracking_on_other_data_compile_nothing(other_subject, tmp_path):
    """Where no shipped build matches (turned off here), the rehearsal on the demo leaves CuPy's
    cache holding what fit-dti and deterministic tracking (whole brain, and from a seed ROI of
    27 voxels) compile on another subject: other shape, other number of volumes, seeds and
    points. Each command is checked on its own; a failure names the kernels it compiled."""
    fresh = tmp_path / "fresh-cache"
    env = _env(fresh, TRACTLENS_SHIPPED_KERNELS="0")
    code = (
        "import json; from tractlens.app import rehearsal; from tractlens.gpu import backend; "
        "ok, gpu = backend.gpu_status(); assert ok, gpu; print(json.dumps(rehearsal.rehearse(gpu)))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == [] and len(result["ran"]) == 9, result
    subject, dti = other_subject, tmp_path / "dti"
    dwi = str(subject / json.loads((subject / "subject.json").read_text())["dwi"])
    track = ["track", "deterministic", "--tensor", str(dti), "--device", "gpu"]
    runs = {
        "fit-dti": ["fit-dti", dwi, "--mask", str(subject / "mask.nii.gz"), "-o", str(dti), "--device", "gpu"],
        "track whole brain": [*track, "--whole-brain", "--mask", str(subject / "mask.nii.gz"), "-o", str(tmp_path / "t.trk")],
        "track seed ROI": [*track, "--seed", str(subject / "seed.nii.gz"), "-o", str(tmp_path / "roi.trk")],
    }  # fmt: skip
    compiled = {label: _compiled_by(argv, env) for label, argv in runs.items()}
    assert not any(compiled.values()), f"kernels compiled after the rehearsal: {compiled}"


def test_the_engine_compiles_one_reduction_kernel_whatever_the_size(tmp_path):
    """gpu_status turns off CuPy's CUB block reductions (sized by the data) and keeps its
    device-wide CUB routines; a sum of booleans over 300 and over 5000 elements then compiles
    one kernel (with CuPy's CUB block reduction: one per block size, 128 and 512 threads, and pass)."""
    pytest.importorskip("cupy")
    code = (
        "import cupy, json; from tractlens.gpu import backend; ok, gpu = backend.gpu_status(); assert ok, gpu; "
        "core = cupy._core; print(json.dumps([core.get_reduction_accelerators(), core.get_routine_accelerators()])); "
        "[int((cupy.arange(n) % 3 == 0).sum()) for n in (300, 5000)]"
    )
    counts = {}
    for setting in ("0", "1"):
        cache = tmp_path / f"cub-block-{setting}"
        env = _env(cache, TRACTLENS_SHIPPED_KERNELS="0", TRACTLENS_CUB_BLOCK_REDUCTION=setting)
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        reduction, routine = json.loads(done.stdout.strip().splitlines()[-1])
        assert (reduction == []) == (setting == "0") and routine != []
        counts[setting] = len([n for n in compiled_names(cache, _cubins(cache)) if "sum" in n])
    assert counts["0"] == 1 and counts["1"] >= 2, counts


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
