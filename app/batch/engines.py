"""The Dask cluster a cohort runs on, chosen from the command line.

* default: a ``distributed.LocalCluster`` of ``--workers`` processes, one thread each (the
  pipelines use their own threads; Dask's nanny keeps BLAS at one thread per process);
* ``--gpus N``: dask-cuda's ``LocalCUDACluster``, one worker per GPU, each pinned to its device
  (``CUDA_VISIBLE_DEVICES`` rotated per worker), with ``NCCL_NVLS_ENABLE=0`` in the workers'
  environment (NVLink multicast off). Without dask-cuda (it pins its own dask and RAPIDS
  packages, which a machine may not have): a ``distributed.LocalCluster`` of N worker processes,
  each pinned to one GPU by a worker plugin (:class:`app.batch.gpu_pin.PinGpu`) that sets its
  ``CUDA_VISIBLE_DEVICES`` before any task (nothing in a worker touches CUDA before one);
  ``--workers-per-gpu K`` starts K such processes on each GPU, each with 1/K of its memory;
* ``--cluster slurm|pbs|sge --cluster-config F``: dask-jobqueue's cluster of that scheduler,
  its arguments from ``F`` (TOML or YAML), scaled to ``jobs`` batch jobs;
* ``--scheduler ADDRESS``: an existing scheduler (``tcp://host:8786``) and its workers.

The local clusters' worker processes share the host's cores: each is given ``cores // workers``
threads (:func:`worker_threads_environ`: OpenMP/BLAS, numba and the engine's own CPU threads,
``TRACTLENS_THREADS``) through Dask's ``distributed.nanny.pre-spawn-environ``, which is applied
before a worker imports anything. Dask's own default there is one BLAS thread per worker
(whatever the cores), while a step's own thread pools would each take up to every core: four
GPU workers on 64 cores then ran their host work single-threaded in places and with 4 × the
cores in others.

:func:`cluster_arguments` says what would be built (class and keyword arguments) without
building it, so each choice is testable on a machine without GPUs or a batch system.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tractlens.gpu import host as gpu_host

from ..errors import InputError
from .config import tomllib

JOBQUEUE_CLASSES = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster"}
GPU_WORKER_ENV = {"NCCL_NVLS_ENABLE": "0"}
#: CuPy's cap on each device's memory pool (bytes or a percentage of the device), read when the
#: pool is made: K workers sharing a GPU get 1/K of it each, so the engines size their batches
#: from their own share (``Backend.free_memory_bytes`` honours the cap) instead of each taking
#: what the other has not allocated yet.
GPU_MEMORY_LIMIT = "CUPY_GPU_MEMORY_LIMIT"
#: The thread-count variables a local worker is given (:func:`worker_threads_environ`).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                    "TRACTLENS_THREADS")  # fmt: skip


def host_cores() -> int:
    """The cores this process may run on (:func:`tractlens.gpu.host.host_cores`)."""
    return gpu_host.host_cores()


def worker_threads_environ(workers: int, cores: int | None = None) -> dict[str, str]:
    """Each of ``workers`` local worker processes' share of the host's ``cores`` (at least one
    thread), as the variables of :data:`THREAD_VARIABLES`; ``TRACTLENS_THREADS`` set in this
    process gives each worker that many instead."""
    given = os.environ.get("TRACTLENS_THREADS", "").strip()
    per = max(1, (cores or host_cores()) // max(1, int(workers)))
    if given.isdigit() and int(given) > 0:
        per = int(given)
    return {name: str(per) for name in THREAD_VARIABLES}


@dataclass
class ClusterChoice:
    """What to build: ``module.name(**kwargs)``, then ``scale(jobs=...)`` for a batch system."""

    module: str
    name: str
    kwargs: dict = field(default_factory=dict)
    jobs: int | None = None
    device: str = "cpu"  # the --device the steps run with
    #: set in this process before the cluster starts; local worker processes inherit it
    #: (LocalCUDACluster replaces a worker ``env`` of its own with CUDA_VISIBLE_DEVICES)
    environ: dict = field(default_factory=dict)
    #: one device per worker, pinned by :class:`app.batch.gpu_pin.PinGpu` (a LocalCluster without dask-cuda)
    pin_gpus: list = field(default_factory=list)
    #: set in each local worker process before it starts (Dask's nanny ``pre-spawn-environ``):
    #: its share of the host's threads (:func:`worker_threads_environ`)
    worker_environ: dict = field(default_factory=dict)

    @property
    def description(self) -> str:
        workers = self.kwargs.get("n_workers")
        return (
            f"{self.name}" + (f" ({workers} workers)" if workers else "") + (f", {self.jobs} jobs" if self.jobs else "")
        )


def cluster_arguments(
    *,
    workers: int | None = None,
    gpus: int | None = None,
    cluster: str | None = None,
    cluster_config: str | Path | None = None,
    workers_per_gpu: int = 1,
) -> ClusterChoice:
    """The cluster the options ask for (without ``--scheduler``, which needs none).

    ``workers_per_gpu`` K > 1 (with ``gpus``) starts K worker processes on each GPU, each with
    its share of the cores: one subject-step's host work (its tractogram going to the disk, the
    next subject's reading) then overlaps another's GPU work on the same device, within 1/K of
    its memory (:data:`GPU_MEMORY_LIMIT`). dask-cuda makes one worker per GPU, so K > 1 always
    takes the LocalCluster with the pinning plugin."""
    if cluster_config is not None and cluster is None:
        raise InputError("--cluster-config belongs to --cluster", fix="Add --cluster slurm|pbs|sge")
    if workers is not None and gpus is not None:
        raise InputError(
            "--gpus makes one worker per GPU: give --workers or --gpus, not both", fix="Drop one of the two"
        )
    if workers_per_gpu < 1:
        raise InputError("--workers-per-gpu must be at least 1", fix="Give worker processes per GPU, e.g. 2")
    if workers_per_gpu > 1 and (gpus is None or cluster is not None):
        raise InputError("--workers-per-gpu belongs to --gpus (a local cluster)", fix="Add --gpus N, or drop it")
    if cluster is not None:
        return _jobqueue_arguments(cluster, cluster_config, gpus)
    if gpus is not None:
        if gpus < 1:
            raise InputError("--gpus must be at least 1", fix="Give how many GPUs to use, e.g. 1")
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if visible and len(visible) < gpus:
            raise InputError(
                f"--gpus {gpus}, but CUDA_VISIBLE_DEVICES shows {len(visible)} ({','.join(visible)})",
                fix="Ask for fewer GPUs, or widen CUDA_VISIBLE_DEVICES",
            )
        devices = visible[:gpus] if visible else [str(i) for i in range(gpus)]  # the first N this process may use
        kwargs = {
            "CUDA_VISIBLE_DEVICES": ",".join(devices),
            "n_workers": gpus * workers_per_gpu,
            "threads_per_worker": 1,
            "dashboard_address": ":0",
            "silence_logs": logging.ERROR,
        }
        threads = worker_threads_environ(gpus * workers_per_gpu)
        if workers_per_gpu > 1 and not os.environ.get(GPU_MEMORY_LIMIT):  # a user's own limit is inherited
            threads[GPU_MEMORY_LIMIT] = f"{100 // workers_per_gpu}%"
        if workers_per_gpu == 1 and importlib.util.find_spec("dask_cuda") is not None:
            return ClusterChoice("dask_cuda", "LocalCUDACluster", kwargs, device="gpu", environ=dict(GPU_WORKER_ENV),
                                 worker_environ=threads)  # fmt: skip
        del kwargs["CUDA_VISIBLE_DEVICES"]
        return ClusterChoice("distributed", "LocalCluster", {**kwargs, "processes": True}, device="gpu",
                             environ=dict(GPU_WORKER_ENV), pin_gpus=devices, worker_environ=threads)  # fmt: skip
    count = workers if workers is not None else max(1, (os.cpu_count() or 2) // 2)
    if count < 1:
        raise InputError("--workers must be at least 1", fix="Give how many worker processes to start, e.g. 4")
    kwargs = {
        "n_workers": count,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": ":0",  # Dask's dashboard on a free port (not 8787, which another run may hold)
        "silence_logs": logging.ERROR,
    }
    return ClusterChoice(
        "distributed", "LocalCluster", kwargs, device="cpu", worker_environ=worker_threads_environ(count)
    )


def read_cluster_config(path: str | Path) -> dict:
    """A cluster config (TOML, or YAML as dask-jobqueue's own ``jobqueue.yaml``): flat keys, or
    ``jobqueue: {slurm: {...}}``; dashes or underscores alike."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read the cluster config ({exc.strerror or exc})", path=path,
                         fix="Give a readable TOML or YAML file to --cluster-config") from None  # fmt: skip
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # the parsers' own error types
        raise InputError(f"cannot parse the cluster config ({exc})", path=path,
                         fix="Check its syntax (.toml is read as TOML, anything else as YAML)") from None  # fmt: skip
    if not isinstance(data, dict):
        raise InputError(
            "the cluster config must be a table of settings",
            path=path,
            fix="Write one setting per line, e.g. cores = 8",
        )
    return data


def _jobqueue_arguments(cluster: str, config_path, gpus: int | None) -> ClusterChoice:
    if cluster not in JOBQUEUE_CLASSES:
        raise InputError(f"unknown --cluster {cluster!r}", fix=f"Choose among: {', '.join(JOBQUEUE_CLASSES)}")
    data = read_cluster_config(config_path) if config_path else {}
    if "jobqueue" in data:
        data = (data["jobqueue"] or {}).get(cluster, {})
    settings = {str(key).replace("-", "_"): value for key, value in data.items()}
    jobs = settings.pop("jobs", 1)
    if not isinstance(jobs, int) or jobs < 1:
        raise InputError(f"jobs must be a whole number ≥ 1, not {jobs!r}", path=config_path, fix="e.g. jobs = 4")
    valid = _jobqueue_keys(cluster)
    unknown = sorted(set(settings) - valid)
    if unknown:
        raise InputError(
            f"{cluster} cluster config: unknown setting {', '.join(unknown)}",
            path=config_path,
            fix=f"Valid settings: jobs, {', '.join(sorted(valid))}",
        )
    missing = [key for key in ("cores", "memory") if key not in settings]
    if missing:
        raise InputError(f"{cluster} cluster config must give {' and '.join(missing)}", path=config_path,
                         fix="e.g. cores = 8 and memory = \"32GB\" (per job)")  # fmt: skip
    settings.setdefault("scheduler_options", {"dashboard_address": ":0"})  # not 8787: another run may hold it
    settings.setdefault("python", sys.executable)  # the workers run this installation's Python
    settings.setdefault("processes", 1)
    settings.setdefault("worker_extra_args", ["--nthreads", "1"] if settings["processes"] == 1 else [])
    if gpus:
        prologue = list(settings.get("job_script_prologue") or [])
        settings["job_script_prologue"] = [*prologue, *(f"export {k}={v}" for k, v in GPU_WORKER_ENV.items())]
    return ClusterChoice("dask_jobqueue", JOBQUEUE_CLASSES[cluster], settings, jobs=jobs,
                         device="gpu" if gpus else "auto")  # fmt: skip


@contextlib.contextmanager
def _keeping_ctrl_c() -> Iterator[None]:
    """Import within it a module that takes Ctrl+C for itself: dask_jobqueue's import sets a
    SIGINT handler that calls ``sys.exit()``, so Ctrl+C ended ``tractlens batch --cluster`` with
    exit status 0 instead of cancelling and reporting the interruption (130). The handler the
    process had is put back."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not previous:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _jobqueue_keys(cluster: str) -> set[str]:
    with _keeping_ctrl_c():
        import dask_jobqueue
        from dask_jobqueue.core import Job

    cls = getattr(dask_jobqueue, JOBQUEUE_CLASSES[cluster])
    names = set(inspect.signature(cls.job_cls.__init__).parameters) | set(inspect.signature(Job.__init__).parameters)
    names |= {"n_workers", "shared_temp_directory", "silence_logs", "name", "host", "scheduler_options", "interface",
              "protocol"}  # fmt: skip
    return names - {"self", "scheduler", "base_class_kwargs", "config_name"}


def import_cluster_class(choice: ClusterChoice):
    try:
        with _keeping_ctrl_c():
            module = importlib.import_module(choice.module)
    except ImportError as exc:
        extra = "batch-gpu" if choice.module == "dask_cuda" else "batch"
        raise InputError(
            f"{choice.module} is not installed ({exc})", fix=f"Install it: pip install 'tractlens[{extra}]'"
        ) from None
    return getattr(module, choice.name)


def start_cluster(choice: ClusterChoice):
    """Build the cluster; with a batch system, ask for its jobs."""
    os.environ.update(choice.environ)
    cls = import_cluster_class(choice)
    if choice.worker_environ:
        import dask

        spawn = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
        dask.config.set({"distributed.nanny.pre-spawn-environ": {**spawn, **choice.worker_environ}})
    try:
        cluster = cls(**choice.kwargs)
    except TypeError as exc:
        raise InputError(
            f"{choice.name} refuses its settings: {exc}",
            fix="Check --cluster-config against dask-jobqueue's documentation",
        ) from None
    if choice.jobs:
        cluster.scale(jobs=choice.jobs)
    return cluster


def connect(address: str | None, choice: ClusterChoice | None):
    """``(client, cluster)``: a client of the scheduler at ``address``, or of a new cluster."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise InputError(f"dask.distributed is not installed ({exc})",
                         fix="Install the cohort extra: pip install 'tractlens[batch]'") from None  # fmt: skip
    if address is not None:
        try:
            return Client(address, timeout="30s"), None
        except (OSError, ValueError) as exc:  # ValueError: an address Dask cannot parse (a scheme it does not know)
            raise InputError(f"cannot reach the Dask scheduler at {address} ({exc})",
                             fix="Check the address (tcp://host:8786) and that the scheduler runs") from None  # fmt: skip
    cluster = start_cluster(choice)
    client = Client(cluster)
    if choice.pin_gpus:
        from .gpu_pin import PinGpu

        client.register_plugin(PinGpu(choice.pin_gpus, choice.environ), name="tractlens-pin-gpu")
    return client, cluster


@contextlib.contextmanager
def workers_without_main() -> Iterator[None]:
    """Local worker processes are spawned, and a spawned process first imports the parent's main
    script unless it can tell it is a module's ``__main__``. A console script without an
    ``if __name__ == "__main__"`` guard would then run ``tractlens batch`` again in every worker.
    The workers need nothing from the script (tasks are functions of :mod:`tractlens`), so its
    path is hidden from multiprocessing while the cluster lives (workers restarted after a crash
    included). Dask's own INFO logging stays out of the command's stderr."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is not None and getattr(main, "__spec__", None) is None:
        del main.__file__
    import distributed  # noqa: F401  (its loggers exist from here on)

    quiet = [
        logging.getLogger(name)
        for name in ["distributed", *logging.root.manager.loggerDict]
        if name.split(".")[0] in ("distributed", "dask_jobqueue", "dask_cuda")
    ]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(max(logger.level, logging.WARNING))
    try:
        yield
    finally:
        if path is not None and not hasattr(main, "__file__"):
            main.__file__ = path
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
