"""A batch step's outputs are flushed to the disk after the step, on the worker's flushing thread,
and its sidecars (the record that it is done) are written only after that (app.batch.durable,
app.io._atomic.durability_deferred): a step whose flush did not happen or failed reads as not
done, and the runner reports it."""

from __future__ import annotations

import errno
import io
import json
import os
import threading
from pathlib import Path

import pytest

from tractlens.app.batch import durable, task
from tractlens.app.batch.naming import sidecar_of
from tractlens.app.batch.provenance import is_done
from tractlens.app.batch.runner import CohortProgress, settle_durability
from tractlens.app.io import _atomic, tractogram_stream


@pytest.fixture
def fsyncs(monkeypatch):
    """Every ``os.fsync`` of this process, by the path of the descriptor."""
    calls: list[str] = []
    real = os.fsync

    def record(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def test_deferred_atomic_writes_are_renamed_but_not_flushed(tmp_path, fsyncs):
    _atomic.write_text_atomic("a", tmp_path / "a.txt")
    assert any(p.endswith("a.txt") or ".a.tmp-" in p for p in fsyncs)  # durable by default
    fsyncs.clear()
    with _atomic.durability_deferred():
        assert _atomic.durability_is_deferred()
        done = threading.Event()
        # a command's own threads (map writers, the tractogram's writer) see it too
        threading.Thread(target=lambda: (_atomic.write_text_atomic("b", tmp_path / "b.txt"), done.set())).start()
        assert done.wait(10)
        assert fsyncs == []
        _atomic.write_text_atomic("c", tmp_path / "c.txt", durable=True)  # asked for: flushed all the same
        assert fsyncs
    assert not _atomic.durability_is_deferred()
    assert (tmp_path / "b.txt").read_text() == "b" and not list(tmp_path.glob(".*tmp-*"))


def test_a_deferred_stream_starts_no_early_write_back(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(tractogram_stream, "_sync_file_range", lambda: lambda fd, offset, n: started.append(n) or 0)
    with open(tmp_path / "f.bin", "wb") as handle:
        handle.write(b"x" * 4096)
        with _atomic.durability_deferred():
            assert tractogram_stream._start_writeback(handle, 0, least=1) == 0
        assert started == []
        assert tractogram_stream._start_writeback(handle, 0, least=1) == 4096 and started == [4096]


def _job(tmp_path: Path) -> task.StepJob:
    return task.StepJob("connectome", "sub-01", ("connectome", "x", "-o", "OUT"), {}, str(tmp_path / "derivatives"),
                        ("sub-01_connectome.csv",))  # fmt: skip


def _staged(tmp_path: Path, job: task.StepJob) -> Path:
    stage = tmp_path / "stage"
    stage.mkdir(exist_ok=True)
    (stage / job.primary[0]).write_text("0,1\n1,0\n")
    return stage


def test_outputs_are_in_place_at_once_and_their_sidecars_only_after_the_flush(tmp_path, monkeypatch):
    job = _job(tmp_path)
    gate, order = threading.Event(), []
    real_fsync_path = task.fsync_path

    def slow_fsync_path(path):
        assert gate.wait(10)
        order.append(("flush", Path(path).name))
        real_fsync_path(path)

    monkeypatch.setattr(task, "fsync_path", slow_fsync_path)
    names, flush = task._move_into_place(job, _staged(tmp_path, job), {"Inputs": {}, "Parameters": {}})
    assert flush.names == tuple(names) and flush.primary == job.primary[0]
    output = Path(job.folder) / job.primary[0]
    assert names == [job.primary[0]] and output.read_text() == "0,1\n1,0\n"  # in place for the next step
    assert not sidecar_of(output).exists() and not is_done(output, {}, {})  # not yet recorded as done
    gate.set()
    [report] = durable.drain()
    assert report["key"] == "connectome/sub-01" and report["seconds"] >= 0
    assert order == [("flush", job.primary[0]), ("flush", "derivatives")]
    assert json.loads(sidecar_of(output).read_text())["StepOutputs"] == names and is_done(output, {}, {})
    assert durable.drain() == []  # reported once


def test_a_failed_flush_writes_no_sidecar_and_is_reported(tmp_path, monkeypatch):
    job = _job(tmp_path)

    def full(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(task, "fsync_path", full)
    task._move_into_place(job, _staged(tmp_path, job), {"Inputs": {}, "Parameters": {}})
    [report] = durable.drain()
    assert report["key"] == "connectome/sub-01" and "Input/output error" in report["error"]
    output = Path(job.folder) / job.primary[0]
    assert output.exists() and not sidecar_of(output).exists() and not is_done(output, {}, {})


class _Client:
    def __init__(self, reports):
        self.reports, self.calls = reports, []

    def run(self, function, *args, on_error="raise"):
        assert function is durable.drain_on_worker and on_error == "return"
        self.calls.append(args)
        return self.reports


def _pending_flush(tmp_path: Path, name: str) -> task.PendingFlush:
    """A step's output in place and what its worker would have flushed."""
    folder = tmp_path / "derivatives"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("data")
    return task.PendingFlush(str(folder), (name,), name, json.dumps({"StepOutputs": [name]}),
                             {name: task._identity(folder / name)})  # fmt: skip


def test_the_runner_reports_each_steps_flush_and_finishes_those_of_lost_workers(tmp_path):
    run = str(tmp_path / ".staging" / "abc123")
    lost = _pending_flush(tmp_path, "lost.csv")  # its worker died before it reported: the runner flushes it
    replaced = _pending_flush(tmp_path, "replaced.csv")
    (tmp_path / "derivatives" / "other.csv").write_text("another run's")
    os.replace(tmp_path / "derivatives" / "other.csv", tmp_path / "derivatives" / "replaced.csv")
    results = [
        {"step": "fit-dti", "subject": "sub-01", "status": "done", "durable": "pending", "timing": {}, "flush": "x"},
        {"step": "track-deterministic", "subject": "sub-01", "status": "done", "durable": "pending"},
        {"step": "connectome", "subject": "sub-01", "status": "done", "durable": "pending"},
        {"step": "fit-dti", "subject": "sub-02", "status": "skipped"},
        None,
        {"step": "fit-dti", "subject": "sub-03", "status": "done", "durable": "pending", "flush": lost},
        {"step": "fit-dti", "subject": "sub-04", "status": "done", "durable": "pending", "flush": replaced},
        {"step": "connectome", "subject": "sub-02", "status": "done", "durable": "pending"},
    ]
    reports = {"tcp://a": [{"key": "fit-dti/sub-01", "seconds": 0.5}, {"key": "connectome/sub-02", "seconds": 0.1}],
               "tcp://b": [{"key": "track-deterministic/sub-01", "error": "OSError: [Errno 28] No space left"}],
               "tcp://c": OSError("Connection reset by peer"),  # a worker lost at the end
               "tcp://d": [{"key": "connectome/sub-02", "error": "RuntimeError: not ours"}]}  # fmt: skip
    stream = io.StringIO()
    client = _Client(reports)
    settle_durability(client, results, CohortProgress(2, 3, stream=stream), run)
    assert client.calls == [(run, durable.FLUSH_STALL_S)]  # only this run's flushes are asked for
    assert results[0]["status"] == "done" and results[0]["timing"]["durable_s"] == 0.5 and "flush" not in results[0]
    assert results[1]["status"] == "failed" and "could not be flushed" in results[1]["reason"]
    assert "No space left" in results[1]["reason"]
    assert results[2]["status"] == "failed" and "does not say what to flush" in results[2]["reason"]
    assert results[3] == {"step": "fit-dti", "subject": "sub-02", "status": "skipped"}
    assert results[5]["status"] == "done" and results[5]["durable"].startswith("done by the runner")
    assert json.loads(sidecar_of(tmp_path / "derivatives" / "lost.csv").read_text()) == {"StepOutputs": ["lost.csv"]}
    assert results[6]["status"] == "failed" and "not the output renamed into place" in results[6]["reason"]
    assert not sidecar_of(tmp_path / "derivatives" / "replaced.csv").exists()
    assert results[7]["status"] == "failed" and "not ours" in results[7]["reason"]  # one report of two failed
    assert stream.getvalue().splitlines() == [
        "cohort: flushing the last outputs to the disk, then their sidecars",
        "cohort: 4 subject-step(s) failed at the flush; the next run does them again, and the steps after them",
    ]
    settle_durability(None, [results[3]])  # nothing pending: no worker is asked


def test_a_drain_gives_only_its_own_runs_flushes():
    durable.later("a/sub-01", lambda: None, run="run-1")
    durable.later("a/sub-01", lambda: None, run="run-2")
    durable.later("b/sub-01", lambda: None, run="run-1")
    assert [r["key"] for r in durable.drain("run-1")] == ["a/sub-01", "b/sub-01"]
    assert [r["key"] for r in durable.drain("run-1")] == []
    assert [r["key"] for r in durable.drain("run-2")] == ["a/sub-01"]


def test_a_flush_writes_no_record_over_outputs_a_later_run_put_there(tmp_path, monkeypatch):
    """An earlier run's flush still queued when the step is done again: its sidecar (its inputs and
    parameters) must not land on the newer outputs."""
    job = _job(tmp_path)
    gate = threading.Event()
    real_fsync_path = task.fsync_path
    monkeypatch.setattr(task, "fsync_path", lambda path: gate.wait(10) and real_fsync_path(path))
    task._move_into_place(job, _staged(tmp_path, job), {"Inputs": {}, "Parameters": {"p": 1}})
    output = Path(job.folder) / job.primary[0]
    newer = tmp_path / "newer.csv"
    newer.write_text("2,2\n")
    os.replace(newer, output)  # the step's output of a later run
    gate.set()
    [report] = durable.drain()
    assert "is not the output renamed into place" in report["error"]
    assert not sidecar_of(output).exists() and output.read_text() == "2,2\n"


def test_a_worker_killed_before_the_drain_is_reported_not_raised(tmp_path):
    """A LocalCluster of two worker processes, each with a flush queued; one is killed before the
    run's drain: nothing is raised, the other's step is reported by its worker, and the killed
    one's flush is finished by the runner."""
    import signal
    import time

    pytest.importorskip("distributed", reason="the batch extra (dask[distributed]) is part of the test extra")
    from distributed import Client, LocalCluster

    def queue(key: str, marker: str) -> int:
        from pathlib import Path as P

        from tractlens.app.batch import durable as d

        d.later(key, lambda: P(marker).write_text("flushed"), run="run-x")
        return os.getpid()

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            workers = list(client.scheduler_info()["workers"])
            pids = [client.submit(queue, f"s/sub-0{k}", str(tmp_path / f"m{k}"), workers=[w], pure=False).result()
                    for k, w in enumerate(workers)]  # fmt: skip
            time.sleep(0.5)  # both flushes written (they only write a marker)
            os.kill(pids[1], signal.SIGKILL)
            results = [{"step": "s", "subject": f"sub-0{k}", "status": "done", "durable": "pending",
                        "flush": _pending_flush(tmp_path, f"out{k}.csv")} for k in range(2)]  # fmt: skip
            settle_durability(client, results, None, "run-x")
    assert results[0]["status"] == "done" and results[0]["durable"] == "done"  # its worker's report
    assert results[1]["status"] == "done" and results[1]["durable"].startswith("done by the runner")
    assert sidecar_of(tmp_path / "derivatives" / "out1.csv").exists()


def test_a_worker_drains_off_its_event_loop(tmp_path):
    """``Client.run`` awaits a coroutine on the worker's event loop: the wait for the flushes is
    on a thread, so the loop (heartbeats) goes on meanwhile."""
    import asyncio

    gate = threading.Event()
    durable.later("a/sub-01", lambda: gate.wait(10))

    async def main():
        drained = asyncio.ensure_future(durable.drain_on_worker())
        ticks = 0
        while not drained.done():
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks == 5:
                gate.set()
        return ticks, drained.result()

    ticks, report = asyncio.run(main())
    assert ticks >= 5 and [r["key"] for r in report] == ["a/sub-01"] and "error" not in report[0]


def test_a_folder_is_flushed_with_its_subfolders(tmp_path, fsyncs):
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "a.nii.gz").write_bytes(b"x")
    (tmp_path / "out" / "b.json").write_text("{}")
    _atomic.fsync_path(tmp_path / "out")
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in fsyncs) == [
        "out", "out/b.json", "out/sub", "out/sub/a.nii.gz"]  # fmt: skip


def test_a_stalled_flush_ends_the_drain_with_a_reason_instead_of_holding_it():
    """A file system that stops answering: the drain waits ``stall_s`` for the next flush, then
    reports it and the later ones still waiting as failed; one already finished is reported done."""
    stuck, release = threading.Event(), threading.Event()
    durable.later("fit-dti/sub-01", lambda: None, run="r")
    durable.later("track/sub-01", lambda: (stuck.set(), release.wait(30)), run="r")
    durable.later("connectome/sub-01", lambda: None, run="r")
    assert stuck.wait(10)
    try:
        report = durable.drain("r", stall_s=0.2)
    finally:
        release.set()
    assert [r["key"] for r in report] == ["fit-dti/sub-01", "track/sub-01", "connectome/sub-01"]
    assert "error" not in report[0]
    assert all("no flush finished within 0.2 s" in r["error"] and "--flush-timeout" in r["error"] for r in report[1:])
    assert durable.drain("r") == []  # reported once; the stuck one finishes on its thread all the same


def test_an_infinite_stall_limit_waits():
    durable.later("a/sub-01", lambda: None, run="r")
    assert [("error" in r) for r in durable.drain("r", stall_s=float("inf"))] == [False]


def test_the_runner_passes_its_stall_limit_to_the_workers(tmp_path):
    client = _Client({"tcp://a": [{"key": "s/sub-01", "error": "TimeoutError: no flush finished within 5 s"}]})
    results = [{"step": "s", "subject": "sub-01", "status": "done", "durable": "pending"}]
    settle_durability(client, results, None, "run-y", 5.0)
    assert client.calls == [("run-y", 5.0)]
    assert results[0]["status"] == "failed" and "no flush finished within 5 s" in results[0]["reason"]


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_the_cli_refuses_a_flush_timeout_that_is_not_a_positive_time(tmp_path, capsys, value):
    from tractlens.app.cli import main

    code = main(["batch", str(tmp_path), "-o", str(tmp_path / "d"), "--pipeline", "fit-dti", "--flush-timeout", value])
    assert code == 2 and "--flush-timeout must be a positive number of seconds" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything is written


def test_a_flush_timeout_of_inf_is_no_limit():
    assert durable.stall_limit(float("inf")) is None and durable.stall_limit(None) is None
    assert durable.stall_limit(30) == 30.0


def test_steps_made_from_an_unflushed_step_say_that_the_next_run_redoes_them():
    from tractlens.app.batch.runner import note_unflushed_upstream

    results = [
        {"step": "fit-dti", "subject": "sub-01", "status": "failed", "durable": "failed"},
        {"step": "track-deterministic", "subject": "sub-01", "status": "done", "durable": "done"},
        {"step": "connectome", "subject": "sub-01", "status": "done", "durable": "done"},
        {"step": "fit-dti", "subject": "sub-02", "status": "done", "durable": "done"},
        {"step": "track-deterministic", "subject": "sub-02", "status": "done", "durable": "done"},
    ]
    dependents = [[1], [2], [], [4], []]
    note_unflushed_upstream(results, dependents)
    assert [("note" in r) for r in results] == [False, True, True, False, False]
    assert results[2]["note"].startswith("made from fit-dti's outputs, which could not be flushed")


def test_a_flush_that_fails_with_etimedout_is_that_failure_not_a_stall():
    """ETIMEDOUT is a TimeoutError: taken for the drain's own timeout, it hid the real error and
    marked every later flush failed without waiting for it."""
    import time

    def timed_out():
        raise OSError(errno.ETIMEDOUT, "Connection timed out")

    durable.later("a/sub-01", timed_out, run="r")
    durable.later("b/sub-01", lambda: time.sleep(0.2), run="r")
    report = durable.drain("r", stall_s=30)
    assert "Connection timed out" in report[0]["error"] and "no flush finished" not in report[0]["error"]
    assert "error" not in report[1] and report[1]["seconds"] >= 0.2
