"""The rehearsal of the GPU commands on the demo (app/rehearsal.py), which compiles CuPy's own
kernels where no shipped build matched: its command lines run (here on the CPU, the same lines
with --device gpu on the GPU machine), it runs once (a stamp in CuPy's cache folder), it can be
cancelled, and the whole warm-up calls it only when needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tractlens.app import kernel_cache, rehearsal
from tractlens.app.pipelines import warmup as pipeline


@pytest.fixture(autouse=True)
def cupy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cupy-cache"))
    monkeypatch.setattr(kernel_cache, "_last", {})
    return tmp_path / "cupy-cache"


@pytest.mark.slow
def test_every_rehearsed_command_runs_on_the_demo_and_a_second_time_is_skipped(cupy_cache):
    seen = []
    result = rehearsal.rehearse("Test GPU", lambda i, n, label: seen.append((i, n, label)), device="cpu")
    assert result["failed"] == [] and not result["cancelled"] and not result["skipped"]
    assert result["ran"] == [label for label, _ in rehearsal.commands(cupy_cache, cupy_cache)]
    assert len(result["ran"]) == 9 and seen[-1][:2] == (9, 9)
    assert rehearsal.stamp("Test GPU").exists()
    again = rehearsal.rehearse("Test GPU", device="cpu", run=lambda argv: pytest.fail("ran again"))
    assert again["skipped"] and again["ran"] == []
    assert not rehearsal.stamp("Another GPU").exists()


def test_a_failing_command_is_logged_and_the_rest_go_on(caplog):
    def run(argv):
        code = "import sys; sys.exit(3)" if argv[0] == "commit" else "pass"
        return subprocess.Popen([sys.executable, "-c", code])

    result = rehearsal.rehearse("Test GPU", run=run)
    assert result["failed"] == ["commit"] and len(result["ran"]) == 8
    assert "GPU rehearsal: commit failed (3)" in caplog.text


def test_cancelling_stops_the_running_command_and_leaves_no_stamp():
    started = []

    def run(argv):
        started.append(argv[0])
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    result = rehearsal.rehearse("Test GPU", cancelled=lambda: bool(started), run=run)
    assert result["cancelled"] and started == ["fit-dti"] and result["ran"] == []
    assert not rehearsal.stamp("Test GPU").exists()


def test_it_is_needed_only_where_no_shipped_build_was_installed(monkeypatch):
    assert rehearsal.needed()
    monkeypatch.setattr(kernel_cache, "_last", {"status": "none"})
    assert rehearsal.needed()
    for status in ("installed", "already"):
        monkeypatch.setattr(kernel_cache, "_last", {"status": status})
        assert not rehearsal.needed()
    monkeypatch.setattr(kernel_cache, "_last", {})
    monkeypatch.setenv("TRACTLENS_REHEARSAL", "0")
    assert not rehearsal.needed()


def test_the_whole_warm_up_rehearses_and_a_commands_warm_up_does_not(monkeypatch):
    calls = []
    monkeypatch.setattr(
        rehearsal, "rehearse", lambda gpu, progress, cancelled: calls.append(gpu) or {"cancelled": False}
    )
    ok = lambda: (True, "Stand-in GPU")  # noqa: E731
    result = pipeline.warm_up_gpu(compile=lambda build: None, gpu_status=ok, rehearse=True)
    assert calls == ["Stand-in GPU"] and result["rehearsal"] == {"cancelled": False}
    pipeline.warm_up_gpu(compile=lambda build: None, gpu_status=ok, methods=("fit-dti",))
    pipeline.warm_up_gpu(compile=lambda build: None, gpu_status=ok)  # stand-in compiler: not by default
    assert calls == ["Stand-in GPU"]
