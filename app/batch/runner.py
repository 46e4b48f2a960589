"""Submit a cohort's task graph to Dask, show its progress, and collect what happened.

Every job is one ``client.submit``, made once the jobs it reads from are done (their results
are its arguments), so a subject's steps run in order and different subjects side by side. At
most as many jobs are submitted as the workers have threads, earlier subjects' steps first: a job
goes to a worker that is free. (Submitted all at once, Dask placed every subject's first step on
a worker at once; on 2 x H200 with 4 subjects per GPU one worker was then busy 80 s and the other
99 s of a 109 s batch.) A result readies the jobs that wait for it at once (a count of missing
upstream results per job), so a turn of the loop costs the same for 10 subjects as for 10,000.
Input problems come back as
results (a failed subject does not stop the others; its later steps are "not run"); other
errors are retried by Dask (``retries``), and a task whose worker dies is rerun by the scheduler
on another one (up to ``distributed.scheduler.allowed-failures`` deaths). On Ctrl+C every
future is cancelled and the caller closes the cluster. Before the results are given, every worker
flushes the outputs of the steps it ran (:func:`settle_durability`): the sidecars that record a
step as done are written only then.

Progress: one line on stderr for the cohort (subject-steps done of subjects × steps) followed by
the step progress of the running tasks, which the workers send as Dask events.
"""

from __future__ import annotations

import heapq
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable

from . import durable
from .plan import Plan
from .task import PROGRESS_TOPIC, complete_flush, run_step

STATUSES = ("done", "skipped", "failed", "not-run")


class CohortProgress:
    """The cohort's progress line on stderr: rewritten on a terminal, one line per finished
    subject-step otherwise. Thread-safe: step progress arrives on the client's event thread."""

    def __init__(self, subjects: int, steps: int, quiet: bool = False, stream=None):
        self.total, self.shape = subjects * steps, (subjects, steps)
        self.counts = dict.fromkeys(STATUSES, 0)
        self.running: dict[str, tuple[str, int, int]] = {}
        self.quiet, self.stream = quiet, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.lock = threading.Lock()

    def step_progress(self, key: str, label: str, done: int, total: int) -> None:
        with self.lock:
            self.running[key] = (label, done, total)
        if self.tty:
            self.draw()

    def finished(self, key: str, status: str) -> None:
        with self.lock:
            self.counts[status] += 1
            self.running.pop(key, None)
        self.draw(line=True)

    def text(self) -> str:
        with self.lock:
            finished = sum(self.counts.values())
            counts = ", ".join(f"{n} {status}" for status, n in self.counts.items() if n)
            running = "; ".join(
                f"{key} {label} {done / total:.0%}"
                for key, (label, done, total) in list(self.running.items())[:3]
                if total
            )
        head = (
            f"cohort: {finished}/{self.total} ({self.shape[0]} subjects × {self.shape[1]} steps) "
            f"{counts or 'starting'}, {time.perf_counter() - self.start:.1f} s"
        )
        return head + (f" | {running}" if running else "")

    def note(self, message: str) -> None:
        """A line of its own (after the progress line), unless quiet."""
        if self.quiet:
            return
        self.stream.write(("\r\033[K" if self.tty else "") + message + "\n")
        self.stream.flush()

    def draw(self, line: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self.text())
            if sum(self.counts.values()) >= self.total:
                self.stream.write("\n")
        elif line:
            self.stream.write(self.text() + "\n")
        self.stream.flush()


def _reason(exc: BaseException) -> str:
    name = type(exc).__name__
    if name == "KilledWorker":
        return "the workers running it died repeatedly (out of memory, or killed); see the workers' logs"
    return f"{name}: {exc}"


def worker_threads(client) -> int:
    """The threads of the cluster's workers now (at least 1: a batch system's may still come)."""
    return max(1, sum(client.nthreads().values()))


def run_plan(
    plan: Plan,
    client,
    *,
    retries: int = 2,
    progress: CohortProgress | None = None,
    on_event: Callable[[dict], None] | None = None,
    task: Callable[..., dict] = run_step,
    flush_timeout_s: float | None = durable.FLUSH_STALL_S,
) -> list[dict]:
    """Run every job of ``plan`` on ``client``; one result per job, in the plan's order. ``on_event``
    sees each step-progress event (``{"key", "label", "done", "total", "pid"}``: the worker process).
    Jobs are submitted as they become ready, at most :func:`worker_threads` at a time (the module
    docstring); ``task(job, *upstream_results)`` runs one (:func:`~.task.run_step`). At the end
    it waits for the workers' flushes (:func:`settle_durability`), at most ``flush_timeout_s``
    seconds for each next one."""
    from distributed import wait

    flush_timeout_s = durable.stall_limit(flush_timeout_s)
    progress = progress or CohortProgress(len(plan.series), len(plan.steps), quiet=True)

    def handle(event) -> None:
        message = event[1] if isinstance(event, tuple) else event
        progress.step_progress(message["key"], message["label"], message["done"], message["total"])
        if on_event is not None:
            on_event(message)

    client.subscribe_topic(PROGRESS_TOPIC, handle)
    token = uuid.uuid4().hex[:8]
    results: list[dict | None] = [None] * len(plan.jobs)
    # Each job's count of upstream jobs without a result, and who waits for whom: a result readies
    # its dependents at once (no scan of every waiting job per turn, which grew with the cohort's
    # square); the ready ones in a heap by plan index, a subject's steps before later subjects'.
    unresolved = [len(waits) for waits in plan.waits_for]
    dependents: list[list[int]] = [[] for _ in plan.jobs]
    for i, waits in enumerate(plan.waits_for):
        for j in waits:
            dependents[j].append(i)
    ready = [i for i, count in enumerate(unresolved) if count == 0]
    heapq.heapify(ready)
    running: dict = {}  # future -> job index

    def resolved(i: int) -> None:
        """Job ``i`` has its result: its dependents whose upstream is all there are ready, or,
        when an upstream job did not succeed, "not run" at once (and so on down the chain)."""
        progress.finished(plan.jobs[i].key, results[i]["status"])
        stack = [i]
        while stack:
            for d in dependents[stack.pop()]:
                unresolved[d] -= 1
                if unresolved[d]:
                    continue
                upstream = [results[j] for j in plan.waits_for[d]]
                if any(u["status"] in ("failed", "not-run") for u in upstream):
                    results[d] = _blocked(plan.jobs[d], upstream)  # nothing to run: not submitted
                    progress.finished(plan.jobs[d].key, results[d]["status"])
                    stack.append(d)
                else:
                    heapq.heappush(ready, d)

    try:
        while ready or running:
            free = worker_threads(client) - len(running)
            while ready and free > 0:
                i = heapq.heappop(ready)
                job, free = plan.jobs[i], free - 1
                upstream = [results[j] for j in plan.waits_for[i]]
                key = f"tractlens-{job.step}-{job.subject}-{token}"
                running[client.submit(task, job, *upstream, key=key, retries=retries, pure=False)] = i
            if not running:
                continue  # (no worker thread yet: a batch system's may still come)
            try:
                done, _ = wait(list(running), timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                progress.draw()
                continue
            for future in sorted(done, key=lambda f: running[f]):
                i = running.pop(future)
                results[i] = _collect(plan, i, future, results)
                resolved(i)
        run = getattr(plan.jobs[0], "staging", None) if plan.jobs else None
        settle_durability(client, results, progress, run, flush_timeout_s)
        note_unflushed_upstream(results, dependents)
    except BaseException:  # Ctrl+C above all: nothing more starts; the caller closes the cluster
        client.cancel(list(running), force=True)
        raise
    finally:
        client.unsubscribe_topic(PROGRESS_TOPIC)
    return results


def settle_durability(
    client,
    results: list,
    progress: CohortProgress | None = None,
    run: str | None = None,
    stall_s: float | None = durable.FLUSH_STALL_S,
) -> None:
    """Wait until every worker has flushed this run's outputs and written their sidecars
    (:func:`.durable.drain_on_worker`; ``run`` is the run's staging folder); each such result gets
    the flush's seconds (``timing.durable_s``), or, where the flush failed, becomes a failure: its
    outputs are in place but not recorded as done, so the next run does the step again (and the
    steps after it, whose inputs it then changes). Where the worker is gone (killed, or retired by
    a batch system) before it reported, the runner finishes the flush itself from the result
    (:func:`.task.complete_flush`; the outputs are checked to be the ones renamed into place), and
    the step is a failure only if that fails too. A worker whose next flush does not finish within
    ``stall_s`` seconds reports it and those after it as failed (:func:`.durable.drain`), so a
    file system that stopped answering ends the run instead of holding it."""
    pending = {r["step"] + "/" + r["subject"]: r for r in results if r and r.get("durable") == "pending"}
    if not pending:
        return
    if progress is not None:
        progress.note("cohort: flushing the last outputs to the disk, then their sidecars")
    reports = client.run(durable.drain_on_worker, run, stall_s, on_error="return")
    found: dict[str, list[dict]] = {}
    for worker in reports.values():
        if isinstance(worker, BaseException):  # a worker lost on the way: its steps are finished below
            continue
        for entry in worker:
            found.setdefault(entry["key"], []).append(entry)
    failed = 0
    for key, r in pending.items():
        entries = found.get(key)
        errors = [e["error"] for e in entries or () if "error" in e]
        flush = r.pop("flush", None)
        if entries and not errors:
            r["durable"] = "done"
            r.setdefault("timing", {})["durable_s"] = max(e["seconds"] for e in entries)
            continue
        if not errors:  # its worker stopped before it reported: the runner finishes the flush
            try:
                if flush is None:
                    raise RuntimeError("the step's result does not say what to flush")
                complete_flush(flush)
                r["durable"] = "done by the runner (its worker stopped)"
                continue
            except Exception as exc:
                errors = [f"its worker stopped before the flush, and the runner's failed: {type(exc).__name__}: {exc}"]
        failed += 1
        r.update(status="failed", durable="failed", reason=f"its outputs could not be flushed to the disk: {errors[0]}")
    if failed and progress is not None:
        progress.note(f"cohort: {failed} subject-step(s) failed at the flush; the next run does them again, "
                      "and the steps after them")  # fmt: skip


def note_unflushed_upstream(results: list, dependents: list[list[int]]) -> None:
    """A step done from an earlier step whose flush failed keeps its outputs (they were made from
    what that step wrote) but is redone by the next run, which redoes the earlier step and so
    changes its inputs: its result says so (``note``), and the summary shows it."""
    stack = [(i, results[i]["step"]) for i, r in enumerate(results) if r and r.get("durable") == "failed"]
    seen = {i for i, _ in stack}
    while stack:
        i, origin = stack.pop()
        for d in dependents[i]:
            if d in seen:
                continue
            seen.add(d)
            stack.append((d, origin))
            if results[d] and results[d].get("status") == "done":
                results[d]["note"] = (f"made from {origin}'s outputs, which could not be flushed to the disk: "
                                      "the next run does it again")  # fmt: skip


def _blocked(job, upstream: list[dict]) -> dict:
    blocked = [u for u in upstream if u["status"] in ("failed", "not-run")]
    return {"step": job.step, "subject": job.subject, "status": "not-run",
            "reason": f"{blocked[0]['step']} did not complete for this subject", "seconds": 0.0}  # fmt: skip


def _collect(plan: Plan, i: int, future, results: list) -> dict:
    job = plan.jobs[i]
    if future.status == "finished":
        return future.result()
    upstream = [results[j] for j in plan.waits_for[i] if results[j] is not None]
    if any(u["status"] in ("failed", "not-run") for u in upstream):
        return _blocked(job, upstream)
    if future.status == "cancelled":
        return {"step": job.step, "subject": job.subject, "status": "not-run", "reason": "cancelled", "seconds": 0.0}
    return {"step": job.step, "subject": job.subject, "status": "failed",
            "reason": _reason(future.exception()), "seconds": 0.0}  # fmt: skip


def summarise(results: list[dict], *, wall_s: float, engine: str) -> dict:
    """The ``--json`` summary: each status's subject-steps, the failures with their reasons,
    the time per step (sum over subjects) and the run's wall time."""
    summary: dict = {status.replace("-", "_"): [] for status in STATUSES}
    step_seconds: dict[str, float] = {}
    for r in results:
        entry = {k: v for k, v in r.items() if k not in ("status", "flush")}
        summary[r["status"].replace("-", "_")].append(entry)
        if r["status"] == "done":
            step_seconds[r["step"]] = round(step_seconds.get(r["step"], 0.0) + r["seconds"], 3)
    summary["counts"] = {status: len(summary[status.replace("-", "_")]) for status in STATUSES}
    summary["step_seconds"] = step_seconds
    summary["wall_s"] = round(wall_s, 3)
    summary["engine"] = engine
    return json.loads(json.dumps(summary, default=str))
