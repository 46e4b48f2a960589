"""A test that crashes its worker fails the run quickly; it never hangs it (tests/_no_worker_restarts.py).

A small pytest run in a temporary folder, spread over two workers as the test command spreads the
suite (``-n 2 --dist loadfile``), with this suite's guard as its conftest: one test kills its own
process with SIGSEGV every time it runs, as the GUI worker died in a CI run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CRASHING = """
import os, signal

def test_before():
    pass

def test_crash():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_after():
    pass
"""

PASSING = """
def test_{0}_one():
    pass

def test_{0}_two():
    pass
"""

CONFTEST = "from tests._no_worker_restarts import no_worker_restarts as pytest_configure\n"


@pytest.mark.slow
def test_a_worker_crash_fails_the_run_and_ends_it(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist (the test extra) spreads the suite over workers")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    for name in ("b", "c", "d"):
        (tmp_path / f"test_{name}.py").write_text(PASSING.format(name))
    # A run of its own: nothing of this session's pytest (an xdist worker's variables, options
    # given through the environment, the running test's name) reaches it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONFAULTHANDLER"))}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"]
    # Without the guard this very run never ends (xdist re-runs the crashing file on a new worker).
    run = subprocess.run(
        [*command, "-rf", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "worker 'gw" in out and "crashed while running 'test_crashing.py::test_crash'" in out, out
    assert "FAILED test_crashing.py::test_crash" in out, out
    assert "crashed and worker restarting disabled" in out, out
    assert "replacing crashed worker" not in out, out
