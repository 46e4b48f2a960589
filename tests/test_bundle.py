"""The Linux bundle (packaging/build_bundle.sh): built from the wheel with PyInstaller, it runs
`tractlens info`, writes the demo and renders the demo window under Xvfb with no Python on PATH
and no PYTHONPATH/PYTHONHOME. Records its size, the build time and the start times in
tests/benchmarks/results/bundle_linux.json (printed too; measured, never judged).

Slow (minutes: a virtual environment with Qt, VTK, NumPy, SciPy from PyPI, then PyInstaller);
needs network access to PyPI, or PIP_INDEX_URL / PIP_FIND_LINKS with the wheels. Without them the
build fails and so does this test, with pip's message."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

import tractlens

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "packaging" / "build_bundle.sh"
RESULTS = ROOT / "tests" / "benchmarks" / "results" / "bundle_linux.json"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.bundle,  # not in the default run (it would add 4-10 minutes to it): .ci/run runs it after the suite
    pytest.mark.skipif(sys.platform != "linux", reason="the bundle is built and tested on Linux only"),
]


def _base_python() -> str:
    """The interpreter the test environment was made from (a venv's python is a link to it)."""
    return getattr(sys, "_base_executable", sys.executable)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> dict:
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        pytest.fail(
            f"{_base_python()} has no shared libpython, which PyInstaller needs: build the bundle with a Python "
            "configured --enable-shared (distribution Pythons, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared)"
        )
    out = tmp_path_factory.mktemp("bundle") / "tractlens"
    command = ["bash", str(SCRIPT), "--out", str(out), "--python", _base_python()]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    build_s = time.perf_counter() - start
    assert done.returncode == 0, (
        f"build_bundle.sh failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    assert (out / "tractlens").is_file() and os.access(out / "tractlens", os.X_OK)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
    return {
        "path": out,
        "build_s": build_s,
        "size_bytes": size,
        "command": " ".join(["packaging/build_bundle.sh", *command[2:]]),
    }


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory) -> dict:
    """A user's environment without Python: PATH holds an empty folder only, no PYTHON* variables."""
    empty = tmp_path_factory.mktemp("bin")
    env = {
        "HOME": str(tmp_path_factory.mktemp("home")),
        "PATH": str(empty),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp_path_factory.mktemp("tmp")),
    }
    for name in ("DISPLAY", "XAUTHORITY"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    assert shutil.which("python3", path=env["PATH"]) is None and shutil.which("python", path=env["PATH"]) is None
    assert not any(k.startswith("PYTHON") for k in env)
    return env


def _run(bundle: dict, args: list[str], env: dict, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [str(bundle["path"] / "tractlens"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return done, time.perf_counter() - start


def test_the_bundle_runs_info_writes_the_demo_and_renders_it_without_python(bundle, bare_env, tmp_path):
    info, info_s = _run(bundle, ["info", "--json"], bare_env)
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout)
    assert summary["version"] == tractlens.__version__
    assert summary["backend"] == "cpu" and summary["gpu_available"] is False  # no CuPy in the default bundle
    assert summary["python"] == platform.python_version()  # the interpreter inside the bundle: the one it was made from

    demo, demo_s = _run(bundle, ["demo-data", str(tmp_path / "demo")], bare_env)
    assert demo.returncode == 0, demo.stderr
    dwi = nib.load(tmp_path / "demo" / "dwi.nii.gz")
    bvals = np.loadtxt(tmp_path / "demo" / "dwi.bval")
    assert dwi.ndim == 4 and dwi.shape[3] == bvals.size and (bvals == 0).any() and (bvals > 0).any()
    assert np.isfinite(dwi.get_fdata()).all()
    assert (tmp_path / "demo" / "bundles.trk").stat().st_size > 0

    if "DISPLAY" not in bare_env:
        pytest.fail("no X display: the screenshot needs Xvfb (packaging/install-deps.sh installs it)")
    png = tmp_path / "demo.png"
    shot, shot_s = _run(bundle, ["--demo", "--screenshot", str(png), "--size", "1200x800", "--exit"], bare_env)
    assert shot.returncode == 0, shot.stderr[-3000:]
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 700 and image.shape[1] >= 1100  # the window as asked (decorations aside)
    colours = np.unique((image[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200, "the screenshot is nearly blank: the 3-D view or the slices did not render"

    record = {
        "what": "the Linux one-folder bundle (PyInstaller) built from the wheel, run with no Python on PATH",
        "command": bundle["command"],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "build_s": round(bundle["build_s"], 1),
        "size_bytes": bundle["size_bytes"],
        "size_mib": round(bundle["size_bytes"] / 2**20, 1),
        "start_info_s": round(info_s, 2),
        "demo_data_s": round(demo_s, 2),
        "window_demo_screenshot_exit_s": round(shot_s, 2),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print("\n" + json.dumps(record, indent=2))
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
