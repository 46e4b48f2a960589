"""One subject-step on a Dask worker: skip it if done, else run the command into a staging
folder, then rename its outputs into place and write their sidecars.

The command runs in the worker process through the ``tractlens`` parser, exactly as typed
(:func:`.steps.step_argv`), with its ``--json`` summary captured for the sidecars and its
progress passed to the cohort display as Dask events (topic :data:`PROGRESS_TOPIC`). Outputs
appear under their final names only by rename, one complete file (or folder) at a time, and
the sidecars come last, once the outputs are flushed to the disk (on the worker's flushing
thread, :mod:`.durable`, while the next step runs): a worker killed or a power cut at any point
leaves either the previous outputs, or outputs without sidecars (which the next run redoes),
never half a file under a sidecar.

A problem with a subject's input (:class:`InputError`, as the command reports it) is returned
as a failure, not raised: Dask would retry it for nothing. Anything else is raised, so Dask
retries it (``retries``), and a lost worker's task is run again elsewhere by the scheduler.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tractlens.gpu.backend import BackendError, OutOfDeviceMemory
from tractlens.gpu.host import host_cores

from .. import __version__
from ..cli._common import relay_progress
from ..cli.parser import build_command_parser
from ..errors import InputError
from ..io._atomic import durability_deferred, fsync_path, write_text_atomic
from ..timing import recorder
from . import durable
from .naming import sidecar_of
from .provenance import fingerprint, is_done, normalised, previous_outputs
from .steps import OUTPUT, STEPS, step_parameters

PROGRESS_TOPIC = "tractlens-batch-progress"
_PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class StepJob:
    """Everything a worker needs to run one step for one subject (plain data: it is pickled)."""

    step: str
    subject: str  # ``sub-01[_ses-pre]``: the name in reports
    argv: tuple[str, ...]  # with :data:`.steps.OUTPUT` as the output
    inputs: dict[str, str]  # role → path, all fingerprinted
    folder: str  # where the outputs go
    primary: tuple[str, ...]  # the outputs later steps read; the first holds the step's record
    options: dict = field(default_factory=dict)  # the step's config options for this subject
    staging: str = ""  # this run's staging folder
    generated_by: tuple[str, ...] = ()  # the batch command line
    #: input path → the name the single-subject command would see it under (the profile's FA map
    #: is ``dti_FA.nii.gz`` there, and the CSV's columns are named after the map's file)
    aliases: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.step}/{self.subject}"


def result(job: StepJob, status: str, start: float, **extra) -> dict:
    return {"step": job.step, "subject": job.subject, "status": status,
            "seconds": round(time.perf_counter() - start, 3), **extra}  # fmt: skip


def run_step(job: StepJob, *upstream: dict) -> dict:
    """Run ``job`` unless an upstream step did not succeed or its outputs are up to date.
    Returns ``{"step", "subject", "status": done|skipped|failed|not-run, "seconds", ...}``."""
    start = time.perf_counter()
    blocked = [u for u in upstream if u["status"] in ("failed", "not-run")]
    if blocked:
        return result(job, "not-run", start, reason=f"{blocked[0]['step']} did not complete for this subject")
    try:
        inputs = {role: fingerprint(Path(path)) for role, path in job.inputs.items()}
    except FileNotFoundError as exc:
        return result(job, "failed", start, reason=f"input not found: {exc.filename}")
    try:
        parameters = step_parameters(job.step, list(job.argv))
    except InputError as exc:
        return result(job, "failed", start, reason=str(exc))
    primary = Path(job.folder) / job.primary[0]
    if is_done(primary, inputs, parameters):
        return result(job, "skipped", start)
    stage = Path(job.staging) / f"{job.subject}_{job.step}_{uuid.uuid4().hex[:8]}"
    try:
        stage.mkdir(parents=True)
        began = time.perf_counter()
        try:
            with durability_deferred():  # flushed by the worker's flushing thread (see .durable)
                summary = _run_command(job, stage)
        except InputError as exc:
            return result(job, "failed", start, reason=str(exc))
        seconds = time.perf_counter() - start
        command_s = time.perf_counter() - began
        record = {"Inputs": inputs, "Parameters": parameters, "Summary": summary, "ComputeSeconds": round(seconds, 3)}
        moved = time.perf_counter()
        written, flush = _move_into_place(job, stage, record)
        move_s = time.perf_counter() - moved
    finally:
        cleaned = time.perf_counter()
        shutil.rmtree(stage, ignore_errors=True)
        clean_s = time.perf_counter() - cleaned
    timing = {"command_s": round(command_s, 3), "move_s": round(move_s, 3), "clean_s": round(clean_s, 3),
              "phases": (summary.get("timings") or {}) if isinstance(summary, dict) else {}}  # fmt: skip
    return result(job, "done", start, outputs=written, timing=timing, worker=worker_identity(), durable="pending",
                  flush=flush)  # fmt: skip


def worker_identity() -> dict:
    """Which worker process ran a step: its process id, the GPU it was pinned to
    (``CUDA_VISIBLE_DEVICES``), its share of the host's threads (``TRACTLENS_THREADS``) and how
    many CPUs it may run on (its affinity: its GPU's, when pinned)."""
    return {"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "threads": os.environ.get("TRACTLENS_THREADS"), "cpus": host_cores(), "host": socket.gethostname()}  # fmt: skip


def _output_path(job: StepJob, stage: Path) -> Path:
    return stage / ("out" if STEPS[job.step].folder_output else job.primary[0])


def _run_command(job: StepJob, stage: Path) -> dict:
    """The command in this process, as typed; its ``--json`` summary back. Its errors are the
    commands' own (InputError, and the engine's, which name what to do)."""

    out = str(_output_path(job, stage))
    named = {}
    for path, alias in job.aliases.items():
        (stage / "inputs").mkdir(exist_ok=True)
        os.symlink(path, stage / "inputs" / alias)
        named[path] = str(stage / "inputs" / alias)
    argv = [out if word == OUTPUT else named.get(word, word) for word in job.argv] + ["--json"]
    spec = STEPS[job.step]
    if spec.parser is not None:  # a step that is not a subcommand here: its own parser, after its words
        args = spec.parser().parse_args(argv[len(spec.command) :])
    else:
        args = build_command_parser().parse_args(argv)
    recorder().reset()  # this step's read/compute/write split in its summary, not the worker's earlier steps'
    stdout = io.StringIO()
    try:
        with relay_progress(_progress_sender(job)), contextlib.redirect_stdout(stdout):
            args.func(args)
    except (BackendError, OutOfDeviceMemory) as exc:
        raise InputError(str(exc), fix='Try [step] device = "cpu" in the config') from None
    text = stdout.getvalue().replace(json.dumps(out)[1:-1], json.dumps(_final_output(job))[1:-1])
    try:  # the summary names the final output, not the staging folder
        return json.loads(text)
    except ValueError:
        return {}


def _progress_sender(job: StepJob):
    """``(label, done, total)`` → a Dask event for the client's display, at most every 0.5 s."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return lambda label, done, total: None
    last = [0.0]

    def send(label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < _PROGRESS_EVERY_S and done < total:
            return
        last[0] = now
        worker.log_event(
            PROGRESS_TOPIC, {"key": job.key, "label": label, "done": done, "total": total, "pid": os.getpid()}
        )

    return send


def _final_output(job: StepJob) -> str:
    """What ``-o`` names once the outputs are in place (for the sidecar's command line)."""
    return job.folder if STEPS[job.step].folder_output else str(Path(job.folder) / job.primary[0])


def _staged_outputs(job: StepJob, stage: Path) -> dict[str, Path]:
    """Final name → staged path of every output the command wrote."""
    spec = STEPS[job.step]
    made = _output_path(job, stage)
    if not spec.folder_output:
        return {job.primary[0]: made}
    prefix = job.subject
    named = {}
    for entry in sorted(made.iterdir()):
        name = spec.rename(entry.name, prefix, job.options)
        if name is not None:
            named[name] = entry
    missing = [name for name in job.primary if name not in named]
    if missing:
        raise RuntimeError(f"{job.step} wrote no {', '.join(missing)}")
    return named


def _move_into_place(job: StepJob, stage: Path, record: dict) -> tuple[list[str], PendingFlush]:
    """Rename the staged outputs over the old ones (first dropping the old sidecars, so an
    interrupted move reads as not done), then queue their flush to the disk and every output's
    sidecar after it (:func:`.durable.later`, :func:`complete_flush`)."""
    folder = Path(job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    staged = _staged_outputs(job, stage)
    primary = folder / job.primary[0]
    for old in {*previous_outputs(primary), *(folder / name for name in staged)}:
        sidecar_of(old).unlink(missing_ok=True)
    for name, path in staged.items():
        target = folder / name
        if target.is_dir():  # a folder output: the old one aside, then the new one in
            shutil.move(str(target), str(stage / f"old-{name}"))
        os.replace(path, target)
    names = list(staged)
    sidecar = {
        "Step": job.step,
        "Command": ["tractlens", *(_final_output(job) if w == OUTPUT else w for w in job.argv)],
        **record,
        "StepOutputs": names,
        "Version": __version__,
        "Host": socket.gethostname(),
        "Created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "GeneratedBy": list(job.generated_by),
        "BatchRun": Path(job.staging).name,  # which run wrote it (its staging folder's name)
    }
    flush = PendingFlush(str(folder), tuple(names), job.primary[0], json.dumps(normalised(sidecar), indent=2),
                         {name: _identity(folder / name) for name in names})  # fmt: skip
    durable.later(job.key, functools.partial(complete_flush, flush), run=job.staging)
    return names, flush


@dataclass(frozen=True)
class PendingFlush:
    """What makes a step's outputs durable and records them (plain data: it travels in the step's
    result, so that the runner can finish it when the worker that queued it is gone)."""

    folder: str
    names: tuple[str, ...]
    primary: str  # the output whose sidecar is written last
    sidecar: str  # the sidecars' text
    placed: dict  # output name → its identity when renamed into place (:func:`_identity`)


def complete_flush(flush: PendingFlush) -> None:
    """The outputs and their folder to the disk, then the sidecars (the step's record last), unless
    an output is not the one renamed into place (a later run of the step put another there, or
    what is seen is not what the worker wrote): its record is then not ours to write."""
    folder = Path(flush.folder)
    for name in flush.names:
        fsync_path(folder / name)
    fsync_path(folder)
    replaced = [name for name in flush.names if _identity(folder / name) != tuple(flush.placed[name])]
    if replaced:
        raise RuntimeError(
            f"{', '.join(replaced)} is not the output renamed into place (a later run's?): no sidecar written"
        )
    for name in sorted(flush.names, key=lambda n: n == flush.primary):
        write_text_atomic(flush.sidecar, sidecar_of(folder / name), durable=True)


def _identity(path: Path) -> tuple:
    """What tells this output from one put under its name later: its inode, and a file's size and
    modification time."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return ()
    return (st.st_dev, st.st_ino) if path.is_dir() else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
