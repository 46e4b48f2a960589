"""The GPU warm-up: every kernel build listed, compiled in order, cancellable, and not started
where no GPU can be used. No GPU needed: the compile function and the GPU probe are stand-ins."""

from types import SimpleNamespace

import pytest

from tractlens.app.pipelines import warmup as pipeline
from tractlens.gpu import cuda, warmup

OK = lambda: (True, "Stand-in GPU")  # noqa: E731


def test_the_catalogue_names_every_kernel_of_every_kernel_file_once():
    builds = warmup.catalogue()
    assert len(set(builds)) == len(builds)
    assert {b.file for b in builds} == {p.name for p in cuda.KERNEL_DIR.glob("*.cu")}
    for build in builds:  # each passes every define its source requires
        cuda.check_defines(build.file, build.headers, build.defines)
        assert '"C" __global__' in cuda.source(build.file, build.headers) or build.file == "dti_fit.cu"
    assert {b.method for b in builds} >= {"fit-dti", "fit-ballstick", "deterministic", "geodesic"}
    assert {b.method for b in builds} >= {"probabilistic", "commit", "select"}


def test_warm_up_compiles_every_build_in_order_and_reports_progress():
    compiled, reports = [], []
    result = pipeline.warm_up_gpu(
        lambda done, total, label: reports.append((done, total, label)), compile=compiled.append, gpu_status=OK
    )
    builds = warmup.catalogue()
    assert compiled == list(builds)
    assert reports == [(i + 1, len(builds), b.label) for i, b in enumerate(builds)]
    assert result["gpu"] is True and result["compiled"] == len(builds) and result["cancelled"] is False
    assert not cuda.warmed()  # a stand-in compile does not count as a warm process


def test_warm_up_stops_between_kernels_when_cancelled():
    compiled = []
    result = pipeline.warm_up_gpu(cancelled=lambda: len(compiled) >= 3, compile=compiled.append, gpu_status=OK)
    assert len(compiled) == 3
    assert result["cancelled"] is True and result["compiled"] == 3


def test_warm_up_without_a_usable_gpu_compiles_nothing_and_does_not_raise():
    compiled = []
    result = pipeline.warm_up_gpu(compile=compiled.append, gpu_status=lambda: (False, "no CUDA device found"))
    assert compiled == [] and result == {
        "gpu": False,
        "reason": "no CUDA device found",
        "compiled": 0,
        "seconds": 0.0,
        "cancelled": False,
    }


class _Runner:
    def __init__(self):
        self.submitted = []

    def submit(self, name, fn, **kwargs):
        self.submitted.append((name, fn))
        return len(self.submitted)


def test_no_warm_up_job_without_cupy_or_on_the_cpu(monkeypatch):
    runner = _Runner()
    monkeypatch.setattr(pipeline.importlib.util, "find_spec", lambda name: None)
    assert pipeline.submit_gpu_warmup(runner, "auto") is None
    monkeypatch.setattr(pipeline.importlib.util, "find_spec", lambda name: object())
    assert pipeline.submit_gpu_warmup(runner, "cpu") is None
    monkeypatch.setenv("TRACTLENS_DISABLE_GPU", "1")
    assert pipeline.submit_gpu_warmup(runner, "auto") is None
    assert runner.submitted == []


@pytest.mark.parametrize("device", ["auto", "gpu"])
def test_one_titled_warm_up_job_where_cupy_is_installed(monkeypatch, device):
    runner = _Runner()
    monkeypatch.delenv("TRACTLENS_DISABLE_GPU", raising=False)
    monkeypatch.setattr(pipeline.importlib.util, "find_spec", lambda name: object())
    assert pipeline.submit_gpu_warmup(runner, device) == 1
    assert [name for name, _ in runner.submitted] == ["Preparing the GPU (first use only)"]


def test_the_warm_up_job_hands_on_progress_and_cancellation_and_never_fails(monkeypatch):
    pytest.importorskip("PySide6")
    runner, seen = _Runner(), {}
    monkeypatch.delenv("TRACTLENS_DISABLE_GPU", raising=False)
    monkeypatch.setattr(pipeline.importlib.util, "find_spec", lambda name: object())

    def warm_up(progress, cancelled):
        seen["cancelled"] = cancelled()
        progress(1, 2, "a.cu:k")
        raise RuntimeError("CUDA driver too old")

    pipeline.submit_gpu_warmup(runner, "auto", warm_up=warm_up)
    reports = []
    ctx = SimpleNamespace(progress=lambda *a: reports.append(a), cancelled=lambda: True)
    result = runner.submitted[0][1](ctx)
    assert seen["cancelled"] is True and reports == [(1, 2, "a.cu:k")]
    assert result["gpu"] is False and "CUDA driver too old" in result["reason"]


def test_the_cli_on_a_machine_without_a_gpu_says_nothing_to_compile(capsys, monkeypatch):
    from tractlens.app.cli import main
    from tractlens.gpu import backend

    monkeypatch.setattr(backend, "gpu_status", lambda: (False, "no CUDA device found"))
    monkeypatch.setattr("tractlens.app.cli.info.gpu_status", lambda: (False, "no CUDA device found"))
    assert main(["info", "--compile"]) == 0
    out = capsys.readouterr().out
    assert "nothing to compile" in out and "kernel cache:" in out


def test_info_compile_lists_what_it_compiled(capsys, monkeypatch):
    import json

    from tractlens.app.cli import info, main

    gpu = SimpleNamespace(total_memory_bytes=lambda: 2**30, free_memory_bytes=lambda: 2**29)
    monkeypatch.setattr(info, "gpu_status", lambda: (True, "Stand-in GPU"))
    monkeypatch.setattr(info, "get_backend", lambda device: gpu)
    monkeypatch.setattr(warmup.KernelBuild, "compile", lambda self: None)
    assert main(["info", "--compile", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [c["kernel"] for c in summary["compiled"]] == [b.label for b in warmup.catalogue()]
    assert summary["compile_s"] >= 0 and summary["kernel_cache_dir"]


def test_a_slow_first_compile_says_so_once(monkeypatch, caplog):
    import logging
    import time

    monkeypatch.setattr(cuda, "SLOW_COMPILE_S", 0.05)
    monkeypatch.setattr(cuda, "_announced", False)
    monkeypatch.setattr(cuda, "_loaded", {})
    with caplog.at_level(logging.INFO, logger="tractlens.gpu.cuda"):
        cuda._timed_build("slow.cu", lambda: time.sleep(0.3))
        cuda._timed_build("fast.cu", lambda: None)
        cuda._timed_build("slow2.cu", lambda: time.sleep(0.3))
    messages = [r.getMessage() for r in caplog.records if r.name == "tractlens.gpu.cuda"]
    assert messages == [cuda.COMPILING_MESSAGE]
    assert {"slow.cu", "fast.cu", "slow2.cu"} <= cuda.loaded_files()


def test_a_fast_compile_from_the_cache_says_nothing(monkeypatch, caplog):
    import logging

    monkeypatch.setattr(cuda, "_announced", False)
    monkeypatch.setattr(cuda, "_loaded", {})
    with caplog.at_level(logging.INFO, logger="tractlens.gpu.cuda"):
        cuda._timed_build("cached.cu", lambda: None)
    assert not [r for r in caplog.records if r.name == "tractlens.gpu.cuda"]
