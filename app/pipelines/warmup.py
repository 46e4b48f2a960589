"""Preparing the GPU in the background: import CuPy and compile every kernel before first use.

The window starts this as one job (:func:`submit_gpu_warmup`) when a GPU may be used, so the
first fit or track does not wait seconds for NVRTC; compiled kernels land in CuPy's disk
cache, so later sessions load them in milliseconds. The job is cancellable between kernels,
never raises a dialog (a GPU that cannot be used is only logged) and is not started where
CuPy is not installed or the device is ``cpu``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

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
) -> dict:
    """Import CuPy, check the device, and compile every kernel (:func:`gpu.warmup.compile_all`).

    Returns ``{"gpu": bool, "reason": str, "compiled": n, "seconds": s, "cancelled": bool}``;
    a GPU that cannot be used is a result (``gpu`` false), not an error. ``compile`` and
    ``gpu_status`` replace the engine's (tests without a GPU).
    """
    import time

    from tractlens.gpu import backend, warmup

    ok, detail = (gpu_status or backend.gpu_status)()
    if not ok:
        log.info("GPU warm-up skipped: %s", detail)
        return {"gpu": False, "reason": detail, "compiled": 0, "seconds": 0.0, "cancelled": False}
    start = time.perf_counter()
    builds = warmup.catalogue()
    done = warmup.compile_all(progress, cancelled, builds=builds, compile=compile)
    seconds = time.perf_counter() - start
    log.info("GPU warm-up: %d of %d kernels ready in %.1f s", len(done), len(builds), seconds)
    return {
        "gpu": True,
        "reason": detail,
        "compiled": len(done),
        "seconds": seconds,
        "cancelled": len(done) < len(builds),
    }


def submit_gpu_warmup(runner, device: str = "auto", *, warm_up: Callable = warm_up_gpu) -> int | None:
    """Start :func:`warm_up_gpu` as a low-priority job on ``runner`` (an :class:`app.jobs.JobRunner`);
    ``None`` when no GPU may be used (:func:`gpu_may_be_used`). Failures are logged, never shown."""
    if not gpu_may_be_used(device):
        return None

    def job(ctx):
        from PySide6.QtCore import QThread

        QThread.currentThread().setPriority(QThread.Priority.LowestPriority)
        try:
            return warm_up(lambda done, total, label: ctx.progress(done, total, label), ctx.cancelled)
        except Exception as exc:  # a broken GPU must not trouble the user: the work falls to the CPU
            log.warning("GPU warm-up failed: %s", exc)
            return {"gpu": False, "reason": str(exc), "compiled": 0, "seconds": 0.0, "cancelled": False}

    return runner.submit(WARMUP_TITLE, job)
