"""Shared fixtures. Tests run on the NumPy backend in CI; the same tests run on
CuPy when selected with ``-m gpu`` on a machine with a CUDA GPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._no_worker_restarts import no_worker_restarts
from tests._private_home import PrivateHome

ARTIFACTS = Path(__file__).parent / "_artifacts"

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each test using this runs on the CPU and, marked ``gpu``, on the GPU."""
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Keep the demo cache out of the user's home; share it within the session."""
    cache = os.environ.get("TRACTLENS_TEST_CACHE") or str(tmp_path_factory.mktemp("tractlens-cache"))
    os.environ["TRACTLENS_CACHE"] = cache
    yield


@pytest.fixture(scope="session")
def demo_dir(_isolated_cache) -> Path:
    from tractlens.app.demo import demo_path

    return demo_path()


@pytest.fixture(scope="session")
def demo_phantom():
    from tractlens.app.demo import make_phantom

    return make_phantom()


@pytest.fixture(scope="session")
def demo_bedpostx(demo_phantom, tmp_path_factory):
    """A bedpostX folder made from the demo phantom's true bundle directions (two strongest
    bundles per voxel, f = 0.6 × occupancy, 10 samples jittered by ~3°), FSL frame."""
    from tractlens.app.io.bedpostx import BedpostSamples, save_bedpostx
    from tractlens.gpu.ballstick import vectors_to_angles

    p = demo_phantom
    rng = np.random.default_rng(0)
    order = np.argsort(-p.occupancy, axis=-1)[..., :2]
    dirs = np.take_along_axis(p.directions, order[..., None], axis=3) * [-1.0, 1.0, 1.0]  # det > 0: x negated
    f = np.take_along_axis(p.occupancy, order, axis=3) * 0.6
    samples = dirs[..., None, :] + rng.normal(0, 0.05, (*dirs.shape[:4], 10, 3))
    theta, phi = vectors_to_angles(np, samples)
    f_samples = np.repeat(f[..., None], 10, axis=-1)
    folder = tmp_path_factory.mktemp("demo") / "demo.bedpostX"
    save_bedpostx(
        folder,
        BedpostSamples(
            theta.astype(np.float32), phi.astype(np.float32), f_samples.astype(np.float32), p.brain, p.affine
        ),
    )
    return folder


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_configure(config):
    ARTIFACTS.mkdir(exist_ok=True)
    no_worker_restarts(config)  # before pytest-xdist's own pytest_configure (trylast) reads the option
    config._tractlens_home = PrivateHome()  # before any test, worker or subprocess can write anything
    if not _is_xdist_controller(config):  # with pytest-xdist the workers run the tests: one Xvfb each
        _ensure_display()


def _is_xdist_controller(config) -> bool:
    """Whether this process hands the tests out to pytest-xdist workers (``-n N``) and runs none itself."""
    if hasattr(config, "workerinput"):  # a worker
        return False
    return bool(getattr(config.option, "numprocesses", None)) and getattr(config.option, "dist", "no") != "no"


def _ensure_display() -> None:
    """GUI tests use a real X server: start Xvfb when there is no display (each pytest-xdist
    worker starts its own: ``-displayfd`` lets the server pick a free display number)."""
    if os.environ.get("DISPLAY") or not shutil.which("Xvfb"):
        return
    import atexit
    import subprocess

    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1920x1080x24", "-nolisten", "tcp"],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()
    if not number:
        proc.kill()
        raise RuntimeError("Xvfb did not start; GUI tests need an X server")
    os.environ["DISPLAY"] = f":{number}"
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
    atexit.register(proc.terminate)


def installed_tool(name: str) -> str | None:
    """A console script of this environment: beside the running interpreter (a venv that
    is not activated), else on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if TractLens wrote into the session's private home instead of its private XDG
    folders; say what changed in the user's real folders meanwhile (tests/_private_home.py)."""
    home = getattr(session.config, "_tractlens_home", None)
    if home is None:
        return
    leaks, foreign = home.leaks(), home.foreign_changes()
    home.close()
    if foreign:
        sys.stderr.write(
            "\nNote: TractLens entries of the real home changed during the run; this session's processes had a "
            "private HOME and XDG folders, so another process on this machine wrote them (ours would have to read "
            "the home from the password database, which tests/test_private_home.py forbids):\n  "
            + "\n  ".join(foreign)
            + "\n"
        )
    if leaks:
        sys.stderr.write(
            "\nThe tests wrote TractLens files under HOME, ignoring XDG_*:\n  " + "\n  ".join(leaks) + "\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def build_kernels():
    """packaging/build_kernels.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "build_kernels", Path(__file__).resolve().parents[1] / "packaging" / "build_kernels.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def numba_disabled(monkeypatch):
    """The CPU engines as without the ``cpu`` extra: numba hidden (``TRACTLENS_DISABLE_NUMBA``),
    so they run their NumPy fallbacks; restored afterwards."""
    from tractlens.gpu import host

    monkeypatch.setenv("TRACTLENS_DISABLE_NUMBA", "1")
    host.numba_module.cache_clear()
    yield
    monkeypatch.delenv("TRACTLENS_DISABLE_NUMBA")
    host.numba_module.cache_clear()
