"""Preparing the GPU in the background: import CuPy and compile every kernel before first use.

The window starts this as one job (:func:`submit_gpu_warmup`) when a GPU may be used, so the
first fit or track does not wait seconds for NVRTC; compiled kernels land in CuPy's disk
cache, so later sessions load them in milliseconds. The job is cancellable between kernels,
never raises a dialog (a GPU that cannot be used is only logged) and is not started where
CuPy is not installed or the device is ``cpu``.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable

from tractlens.gpu import backend

from ..timing import recorder

log = logging.getLogger(__name__)

#: The job's title in the job list.
WARMUP_TITLE = "Preparing the GPU (first use only)"


def gpu_may_be_used(device: str) -> bool:
    """Whether ``device`` (auto/gpu) may run on a GPU here, judged without importing CuPy."""
    if (device or "auto").lower() == "cpu" or os.environ.get("TRACTLENS_DISABLE_GPU"):
        return False
    return importlib.util.find_spec("cupy") is not None


def warm_up_gpu(
    progress: Callable[[int, int, str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    *,
    compile: Callable | None = None,
    gpu_status: Callable[[], tuple[bool, str]] | None = None,
    methods: tuple[str, ...] | None = None,
    rehearse: bool | None = None,
) -> dict:
    """Import CuPy, check the device, and compile every kernel (:func:`gpu.warmup.compile_all`),
    or only those of ``methods`` (names of :func:`gpu.warmup.catalogue`'s builds).

    Returns ``{"gpu": bool, "reason": str, "compiled": n, "seconds": s, "cancelled": bool}``;
    a GPU that cannot be used is a result (``gpu`` false), not an error. ``compile`` and
    ``gpu_status`` replace the engine's (tests without a GPU).

    A whole warm-up (``methods`` None) then rehearses the GPU commands on the demo
    (:func:`app.rehearsal.rehearse`: CuPy's own kernels), once per machine, where no kernels
    shipped with TractLens matched it; ``rehearse`` forces it on or off (default: on with the
    real compiler). The result then has ``rehearsal`` too.
    """
    # The kernel catalogue imports every engine: only a warm-up needs it, not every command that
    # imports this module (the pipelines wait for a background warm-up through it).
    from tractlens.gpu import warmup

    began = time.perf_counter()
    ok, detail = (gpu_status or backend.gpu_status)()
    # CuPy's import, the shipped kernels' installation (app.kernel_cache), the probe kernel
    recorder().detail("gpu_warmup", {"gpu_status": time.perf_counter() - began})
    if not ok:
        log.info("GPU warm-up skipped: %s", detail)
        return {"gpu": False, "reason": detail, "compiled": 0, "seconds": 0.0, "cancelled": False}
    start = time.perf_counter()
    builds = warmup.catalogue()
    if methods is not None:  # a part only: compiled as the engine would, not counted as a whole warm-up
        builds = tuple(build for build in builds if build.method in methods)
        compile = compile or warmup.KernelBuild.compile
    rehearse = (methods is None and compile is None) if rehearse is None else rehearse
    done = warmup.compile_all(progress, cancelled, builds=builds, compile=compile)
    rehearsal = None
    if rehearse and len(done) == len(builds):
        from .. import rehearsal as _rehearsal

        if _rehearsal.needed():
            rehearsal = _rehearsal.rehearse(detail, progress, cancelled)
    seconds = time.perf_counter() - start
    log.info("GPU warm-up: %d of %d kernels ready in %.1f s", len(done), len(builds), seconds)
    return {
        "gpu": True,
        "reason": detail,
        "compiled": len(done),
        "seconds": seconds,
        "cancelled": len(done) < len(builds) or bool(rehearsal and rehearsal["cancelled"]),
        **({"rehearsal": rehearsal} if rehearsal is not None else {}),
    }


def submit_gpu_warmup(runner, device: str = "auto", *, warm_up: Callable = warm_up_gpu) -> int | None:
    """Start :func:`warm_up_gpu` as a low-priority job on ``runner`` (the window's job runner, or
    anything with its ``submit(name, fn, *, low_priority)``);
    ``None`` when no GPU may be used (:func:`gpu_may_be_used`). Failures are logged, never shown."""
    if not gpu_may_be_used(device):
        return None

    def job(ctx):
        try:
            return warm_up(lambda done, total, label: ctx.progress(done, total, label), ctx.cancelled)
        except Exception as exc:  # a broken GPU must not trouble the user: the work falls to the CPU
            log.warning("GPU warm-up failed: %s", exc)
            return {"gpu": False, "reason": str(exc), "compiled": 0, "seconds": 0.0, "cancelled": False}

    return runner.submit(WARMUP_TITLE, job, low_priority=True)


class BackgroundWarmup:
    """:func:`warm_up_gpu` for some methods on a thread of its own, while the command reads its files.

    :meth:`join` waits for it (the pipelines call :func:`join_background_warmup` before their
    first GPU work, so CuPy is imported and the kernels compiled once, not raced). A failure
    in the thread is kept in :attr:`error` and logged, never raised here: the computation then
    meets the same condition where it always did and reports it, or falls back to the CPU, by
    the usual rules. At exit a warm-up still running is cancelled between kernels."""

    def __init__(self, methods: tuple[str, ...], *, warm_up: Callable | None = None):
        self.methods = tuple(methods)
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.joined = False
        self._cancel = threading.Event()
        self._warm_up = warm_up or warm_up_gpu
        self._thread = threading.Thread(target=self._run, name="tractlens-gpu-warmup", daemon=True)

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            self.result = self._warm_up(cancelled=self._cancel.is_set, methods=self.methods)
        except BaseException as exc:  # kept for the log; the computation meets it again itself
            self.error = exc
        finally:
            recorder().detail("gpu_warmup", {"thread": time.perf_counter() - began})

    def start(self) -> BackgroundWarmup:
        self._thread.start()
        atexit.register(self.cancel)
        return self

    def cancel(self) -> None:
        self._cancel.set()
        self._thread.join()

    def join(self) -> dict | None:
        """Wait for the warm-up; its result (None when it failed)."""
        if self._thread.is_alive() or not self.joined:
            began = time.perf_counter()
            self._thread.join()
            self.joined = True
            # what the command waited for it (the whole-command benchmark's cold runs show it)
            recorder().detail("gpu_warmup", {"waited": time.perf_counter() - began})
            if self.error is not None:
                log.info("GPU warm-up failed (%s); the GPU is set up when it is first used", self.error)
        return self.result


_background: list[BackgroundWarmup] = []


def start_background_warmup(
    methods: tuple[str, ...], device: str = "auto", *, warm_up: Callable | None = None
) -> BackgroundWarmup | None:
    """Start a :class:`BackgroundWarmup` for ``methods`` when ``device`` may run on a GPU here
    (:func:`gpu_may_be_used`: not ``cpu``, CuPy installed); otherwise nothing (None)."""
    if not gpu_may_be_used(device):
        return None
    handle = BackgroundWarmup(methods, warm_up=warm_up or warm_up_gpu).start()
    _background.append(handle)
    return handle


def join_background_warmup() -> None:
    """Wait for every warm-up started by :func:`start_background_warmup` (none: returns at once)."""
    while _background:
        _background.pop(0).join()
