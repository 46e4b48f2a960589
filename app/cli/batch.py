"""``tractlens batch``: the single-subject pipelines over a BIDS dataset, on Dask.

Dask, dask-jobqueue and pybids are the ``batch`` extra, imported only when the command runs.
Exit status 0 when every subject-step was done or skipped, :data:`EXIT_SOME_FAILED` when any
failed or could not run (the summary says which and why), 2 for unusable options or dataset,
130 on Ctrl+C or SIGTERM (the cluster closed, the staging folder removed: no half-written output).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError
from ._common import EXIT_OK, emit

#: Some subject-steps failed or could not run; the others were done.
EXIT_SOME_FAILED = 3


def add_parsers(sub, common) -> None:
    # app.batch is imported when the batch command is built or run, not with this module: it reads
    # the single-subject commands through app.cli.parser, and importing any module of app.cli
    # first runs app/cli/__init__.py, which imports this one. No module-level import cycle; a
    # worker that unpickles app.batch.task first must not find app.batch half-imported.
    from ..batch.durable import FLUSH_STALL_S
    from ..batch.steps import STEPS

    p = sub.add_parser(
        "batch",
        parents=[common],
        help="run pipeline steps over every subject of a BIDS dataset, on Dask (local processes, GPUs, a cluster)",
        description="Runs the single-subject commands (the same parameters and outputs) for every DWI series of "
        "a BIDS dataset and writes BIDS derivatives, each output with a JSON sidecar of its provenance. A step "
        "whose outputs are there with the same inputs and parameters is skipped, so a second run does only what "
        "is missing. Parameters come from --config, a TOML file with a table per step whose keys are the "
        "step's flags without dashes. Exit status 3 when any subject-step failed (the others are done).",
    )
    p.add_argument("bids_dir", metavar="BIDS_DIR", help="the BIDS dataset (holds dataset_description.json)")
    p.add_argument("-o", "--output", required=True, metavar="DERIVATIVES_DIR", help="derivatives folder")
    p.add_argument("--pipeline", required=True, metavar="STEP[,STEP...]", help=f"steps: {', '.join(STEPS)}")
    p.add_argument("--participant-label", nargs="+", metavar="LABEL", help="only these participants (01 or sub-01)")
    p.add_argument("--session-label", nargs="+", metavar="LABEL", help="only these sessions")
    p.add_argument("--config", metavar="PARAMS.toml", help="parameters: [step] tables, keys = the step's flag names")
    p.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: half the CPU cores)")
    p.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="one worker per GPU: dask-cuda's LocalCUDACluster where installed, else a LocalCluster of one worker "
        "process pinned to each GPU; each local worker gets cores/N threads for its host work (OpenMP/BLAS, "
        "numba, the engine's pools; TRACTLENS_THREADS=K gives each K)",
    )
    p.add_argument(
        "--workers-per-gpu",
        type=int,
        default=1,
        metavar="K",
        help="with --gpus: K worker processes share each GPU, each with 1/K of its memory (CuPy's pool cap, "
        "CUPY_GPU_MEMORY_LIMIT, unless set) and cores/(N*K) threads, so one subject's tractogram goes to the disk "
        "while the next subject computes on the GPU",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler, e.g. tcp://host:8786")
    where.add_argument(
        "--cluster", choices=("slurm", "pbs", "sge"), help="submit workers as batch jobs (dask-jobqueue)"
    )
    p.add_argument("--cluster-config", metavar="F", help="the batch jobs' settings (TOML or YAML; see the README)")
    p.add_argument(
        "--flush-timeout",
        type=float,
        default=FLUSH_STALL_S,
        metavar="S",
        help="seconds the end of the run waits for a worker's next output to be flushed to the disk; when none "
        "finishes within it (a network file system that stopped answering), the steps still waiting are reported "
        "failed and done again by the next run (default: %(default)g)",
    )
    p.set_defaults(func=cmd_batch)


def _check_options(args) -> None:
    """What only the command line can get wrong: a local cluster's options beside ``--scheduler``
    (the parser keeps ``--cluster`` from it). The cluster's own options are checked by
    :func:`..batch.engines.cluster_arguments`, for Python callers too."""
    if args.scheduler and args.workers_per_gpu != 1:
        raise InputError(
            "--workers-per-gpu belongs to --gpus (a local cluster), not to --scheduler", fix="Drop one of the two"
        )
    if args.scheduler and (args.workers is not None or args.gpus is not None):
        raise InputError(
            "--workers/--gpus make a local cluster; with --scheduler the scheduler's workers run the steps",
            fix="Drop them, or --scheduler",
        )


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a batch system's time limit, ``timeout``, ``docker stop``) ends the run as Ctrl+C
    does: the tasks cancelled, the cluster closed, the staging folder removed, exit status 130."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signal handlers belong to the main thread)
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(
            signal.SIGTERM, previous if previous is not None else signal.SIG_DFL
        )  # (None: set outside Python)


def cmd_batch(args) -> int:
    from ..batch.cohort import write_cohort_profiles
    from ..batch.config import load_config
    from ..batch.dataset import find_series
    from ..batch.durable import stall_limit
    from ..batch.engines import cluster_arguments, connect, workers_without_main
    from ..batch.naming import check_derivatives, command_line, write_dataset_description
    from ..batch.plan import build_plan
    from ..batch.runner import CohortProgress, run_plan, summarise
    from ..batch.staging import claim_staging, clear_dead_runs, remove_staging
    from ..batch.steps import parse_steps

    _check_options(args)
    stall_limit(args.flush_timeout)  # before the cluster starts
    steps = parse_steps(args.pipeline)
    config = load_config(args.config, steps)
    bids_dir = Path(args.bids_dir).resolve()  # real paths: the sidecars' inputs do not depend on how they were named
    series = find_series(bids_dir, args.participant_label, args.session_label)
    derivatives = check_derivatives(Path(args.output), bids_dir)
    choice = None
    if args.scheduler is None:
        choice = cluster_arguments(
            workers=args.workers,
            gpus=args.gpus,
            cluster=args.cluster,
            cluster_config=args.cluster_config,
            workers_per_gpu=args.workers_per_gpu,
        )
    staging = derivatives / ".staging" / uuid.uuid4().hex[:12]
    plan = build_plan(series, steps, config, derivatives, device=choice.device if choice else "auto",
                      staging=staging, generated_by=command_line())  # fmt: skip
    write_dataset_description(derivatives, bids_dir, command_line())
    start = time.perf_counter()
    progress = CohortProgress(len(series), len(steps), quiet=args.quiet)
    claim_staging(staging)
    cleared = clear_dead_runs(staging.parent, keep=staging)
    if cleared:
        progress.note(f"cohort: removed what {len(cleared)} killed earlier run(s) left in {staging.parent}")
    client = cluster = None
    with workers_without_main(), _terminate_as_interrupt():
        try:
            client, cluster = connect(args.scheduler, choice)
            started = time.perf_counter() - start  # the cluster's start (worker processes, imports)
            results = run_plan(plan, client, progress=progress, flush_timeout_s=args.flush_timeout)
        finally:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
            remove_staging(staging)
    cohort = write_cohort_profiles(plan, results, derivatives)  # the profiles step's group table
    engine = args.scheduler or choice.description
    summary = {"bids_dir": str(bids_dir), "derivatives": str(derivatives), "pipeline": steps,
               "subjects": len(series), "cluster_start_s": round(started, 3),
               **summarise(results, wall_s=time.perf_counter() - start, engine=engine)}  # fmt: skip
    if cohort is not None:
        summary["cohort_profiles"] = cohort
    counts = summary["counts"]
    failures = "".join(f"\n  {f['subject']} {f['step']}: {f['reason']}" for f in summary["failed"])
    failures += "".join(f"\n  {d['subject']} {d['step']}: done; {d['note']}" for d in summary["done"] if d.get("note"))
    human = (
        f"{len(series)} subjects × {len(steps)} steps: {counts['done']} done, {counts['skipped']} skipped, "
        f"{counts['failed']} failed, {counts['not-run']} not run, in {summary['wall_s']:.1f} s on {engine}; "
        f"derivatives in {derivatives}{failures}"
    )
    if cohort is not None:
        human += f"\ncohort profiles of {len(cohort['subjects'])} subject-sessions: {cohort['output']}"
    emit(args, summary, human)
    return EXIT_SOME_FAILED if counts["failed"] or counts["not-run"] else EXIT_OK
