"""The GPU start-up off the critical path: the GPU commands import CuPy and compile their kernels
on a thread while they read their files, and wait for it before the computation. No GPU needed:
the warm-up and the GPU probe are stand-ins."""

from __future__ import annotations

import argparse
import logging
import threading

import pytest

from tractlens.app.cli import _common as common
from tractlens.app.cli import main
from tractlens.app.cli._common import WARMUP_METHODS
from tractlens.app.pipelines import warmup as pipeline
from tractlens.gpu import cuda


@pytest.fixture
def events(monkeypatch):
    """A GPU that may be used, a stand-in warm-up that waits until the files are read, and a
    log of what happened in which order (reading, warm-up, the device choice of the compute)."""
    log: list[str] = []
    read = threading.Event()
    monkeypatch.setattr(pipeline, "gpu_may_be_used", lambda device: device.lower() != "cpu")
    monkeypatch.setattr(pipeline, "_background", [])
    monkeypatch.setattr(common, "AUTO_WARMUP_MIN_BYTES", 0)  # the demo is small: warm up all the same

    def stand_in(progress=None, cancelled=None, *, methods=None, **kwargs):
        log.append(f"warm-up started {','.join(methods)} on {threading.current_thread().name}")
        assert read.wait(30), "the files were never read"
        log.append("warm-up done")
        return {"gpu": False, "reason": "stand-in", "compiled": 0, "seconds": 0.0, "cancelled": False}

    monkeypatch.setattr(pipeline, "warm_up_gpu", stand_in)
    from tractlens.app import io
    from tractlens.app.pipelines import dti

    real_load, real_decide = io.load_dwi, dti.decide_device

    def load_dwi(*args, **kwargs):
        log.append("reading")
        try:
            return real_load(*args, **kwargs)
        finally:
            read.set()

    def decide_device(*args, **kwargs):
        log.append("compute")
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(io, "load_dwi", load_dwi)
    monkeypatch.setattr(dti, "decide_device", decide_device)
    return log


def test_fit_dti_warms_the_gpu_while_reading_and_waits_before_the_fit(events, demo_dir, tmp_path):
    code = main(["fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert "warm-up started fit-dti on tractlens-gpu-warmup" in events
    assert events.index("reading") < events.index("warm-up done") < events.index("compute")
    assert not pipeline._background  # joined


def test_nothing_is_started_for_the_cpu(events, demo_dir, tmp_path):
    code = main(["fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(tmp_path / "out"), "--device", "cpu", "--quiet"])
    assert code == 0 and events == ["reading", "compute"]


def test_a_failing_warm_up_is_not_raised_and_the_fit_runs_as_without_it(monkeypatch, demo_dir, tmp_path, caplog):
    monkeypatch.setattr(common, "AUTO_WARMUP_MIN_BYTES", 0)
    monkeypatch.setattr(pipeline, "gpu_may_be_used", lambda device: True)
    monkeypatch.setattr(pipeline, "_background", [])
    seen = []

    def broken(**kwargs):
        seen.append(kwargs["methods"])
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(pipeline, "warm_up_gpu", broken)
    with caplog.at_level(logging.INFO):
        code = main(["fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(tmp_path / "a"), "--quiet", "--json"])
    assert code == 0 and seen == [("fit-dti",)]
    assert "GPU warm-up failed (CUDA driver version is insufficient" in caplog.text
    assert (tmp_path / "a" / "dti_FA.nii.gz").exists()


def test_a_forced_gpu_that_cannot_be_used_fails_as_before_without_a_warm_up(events, demo_dir, tmp_path, monkeypatch):
    from tractlens.gpu import backend

    monkeypatch.setattr(backend, "gpu_status", lambda: (False, "no CUDA device found"))
    code = main(["fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(tmp_path / "out"), "--device", "gpu"])
    assert code != 0 and events == []


def test_the_background_warm_up_compiles_only_the_commands_kernels_and_keeps_its_error(monkeypatch):
    monkeypatch.setattr(cuda, "_warmed", False)  # as in a fresh process
    compiled = []
    handle = pipeline.BackgroundWarmup(
        WARMUP_METHODS["probabilistic"],
        warm_up=lambda **kw: pipeline.warm_up_gpu(compile=compiled.append, gpu_status=lambda: (True, "GPU"), **kw),
    ).start()
    result = handle.join()
    assert {b.method for b in compiled} == {"probabilistic", "tracking"} and result["compiled"] == len(compiled)
    assert not cuda.warmed()  # a part of the catalogue is not a whole warm-up

    def fail(**kw):
        raise OSError("nvrtc: cannot open libnvrtc.so")

    handle = pipeline.BackgroundWarmup(("commit",), warm_up=fail).start()
    assert handle.join() is None and isinstance(handle.error, OSError) and handle.joined


def test_start_is_a_no_op_where_no_gpu_may_be_used(monkeypatch):
    monkeypatch.setattr(pipeline, "_background", [])
    monkeypatch.setattr(pipeline.importlib.util, "find_spec", lambda name: None)  # no CuPy here
    assert pipeline.start_background_warmup(("fit-dti",), "auto") is None
    assert pipeline.start_background_warmup(("fit-dti",), "cpu") is None
    assert pipeline._background == []
    pipeline.join_background_warmup()  # nothing to wait for


@pytest.mark.parametrize(
    "argv, methods",
    [
        (["track", "probabilistic", "--samples", "S", "--seed", "M", "-o", "O"], ("probabilistic", "tracking")),
        (["commit", "--dwi", "D", "--tractogram", "T.trk", "-o", "O"], ("commit",)),
        (["track", "deterministic", "--dwi", "D", "--whole-brain", "-o", "O.trk"], WARMUP_METHODS["deterministic"]),
        (["track", "geodesic", "--tensor", "T", "--seed", "M", "-o", "O.trk"], ("geodesic", "tracking")),
    ],
)
def test_track_and_commit_start_their_warm_up_before_reading(argv, methods, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(pipeline, "gpu_may_be_used", lambda device: True)
    monkeypatch.setattr(pipeline, "_background", [])
    monkeypatch.setattr(pipeline, "warm_up_gpu", lambda **kw: started.append(kw["methods"]))
    monkeypatch.setattr(common, "AUTO_WARMUP_MIN_BYTES", 0)
    assert main(argv) != 0  # the inputs do not exist: an input error, after the warm-up started
    expected = (*methods, "fit-dti") if "--dwi" in argv and argv[0] == "track" else methods
    assert started == [expected]


def test_auto_warms_up_only_for_inputs_large_enough_to_go_to_the_gpu(monkeypatch, demo_dir, tmp_path):
    started = []
    monkeypatch.setattr(pipeline, "gpu_may_be_used", lambda device: True)
    monkeypatch.setattr(pipeline, "_background", [])
    monkeypatch.setattr(pipeline, "warm_up_gpu", lambda **kw: started.append(kw["methods"]))
    dwi = demo_dir / "dwi.nii.gz"
    assert dwi.stat().st_size < common.AUTO_WARMUP_MIN_BYTES  # the demo: the CPU's by the cost model
    args = argparse.Namespace(dwi=str(dwi), device="auto")
    assert common.warm_up_gpu_in_background(args, "fit-dti") is None and started == []
    pipeline.join_background_warmup()
    args.device = "gpu"  # asked for: warmed up whatever the size
    assert common.warm_up_gpu_in_background(args, "fit-dti") is not None
    pipeline.join_background_warmup()
    assert started == [("fit-dti",)]
    monkeypatch.setattr(common, "AUTO_WARMUP_MIN_BYTES", dwi.stat().st_size)  # large enough now
    args.device = "auto"
    assert common.warm_up_gpu_in_background(args, "fit-dti") is not None
    pipeline.join_background_warmup()
    assert started == [("fit-dti",), ("fit-dti",)]


def test_the_warm_up_puts_its_stages_in_the_commands_timings(monkeypatch):
    """gpu_status (CuPy's import, the shipped kernels' installation, the probe), the thread's
    whole time and what the command waited for it: details_s["gpu_warmup"] of the timings that
    the whole-command benchmark compares between a cold and a warm run. A stand-in clock moves
    only where the stand-in GPU works (0.5 s probe, 0.25 s per kernel), so the numbers are exact."""
    from tractlens.app.timing import PhaseRecorder

    fresh = PhaseRecorder()
    monkeypatch.setattr(pipeline, "recorder", lambda: fresh)
    clock = [1000.0]
    monkeypatch.setattr(pipeline.time, "perf_counter", lambda: clock[0])

    def probe():
        clock[0] += 0.5
        return True, "GPU"

    def compile_one(build):
        clock[0] += 0.25

    handle = pipeline.BackgroundWarmup(
        ("commit",), warm_up=lambda **kw: pipeline.warm_up_gpu(compile=compile_one, gpu_status=probe, **kw)
    ).start()
    result = handle.join()
    stages = fresh.snapshot()["details_s"]["gpu_warmup"]
    assert set(stages) == {"gpu_status", "thread", "waited"}
    assert stages["gpu_status"] == 0.5 and stages["thread"] == 0.5 + 0.25 * result["compiled"]
    assert 0 <= stages["waited"] <= stages["thread"]  # all of it or none, as the threads ran
