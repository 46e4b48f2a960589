"""GPU out of memory: the engines halve their batches first; what still does not fit runs on the CPU.

Every engine sizes its batches from the free device memory and halves a batch that runs out
of memory (:func:`gpu.backend.iter_batched`); only when a batch of one item does not fit (the
card is taken by another program, or the data alone exceed it) does it raise
:class:`~gpu.backend.OutOfDeviceMemory`. The pipelines then carry on on the CPU, and say so in
their notes, when the device was chosen automatically (``device="auto"``). A user who forced
``device="gpu"`` gets the error (with the advice to use the CPU), not a run that may take hours.

* :func:`run_with_cpu_fallback` — a computation that returns one result: done again on the CPU.
* :func:`batches_with_cpu_fallback` — a stream of batches over items (seeds, fibres): the CPU
  continues from the first item the GPU had not finished, so nothing is delivered twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from tractlens.gpu.backend import Backend, OutOfDeviceMemory, get_backend

from .warmup import join_background_warmup

log = logging.getLogger(__name__)
T = TypeVar("T")


def _falls_back(exc: BaseException, backend: Backend, device) -> bool:
    if not backend.is_gpu or (isinstance(device, str) and device.lower() != "auto"):
        return False
    return isinstance(exc, OutOfDeviceMemory) or (isinstance(exc, Exception) and backend.is_out_of_memory(exc))


def _note(backend: Backend, what: str, exc: BaseException, done: int | None = None, batched: bool = True) -> str:
    where = "" if done is None else f" after {done} items on the GPU"
    smallest = " even in the smallest batches" if batched else ""
    message = (
        f"{backend.device_name} ran out of memory for {what}{smallest} ({exc}); "
        f"it was computed on the CPU instead{where}, which is slower"
    )
    log.warning("%s", message)
    return message


def run_with_cpu_fallback(
    run: Callable[[Backend], T], device, notes: list[str], what: str, *, batched: bool = True
) -> T:
    """``run(backend)`` on ``device``; on the CPU again (a note added to ``notes``) when the GPU
    runs out of memory and ``device`` is ``"auto"``. ``batched``: ``run`` works in batches that
    it halves before it gives up (the note says so)."""
    join_background_warmup()  # CuPy imported and kernels compiled once, not raced
    backend = get_backend(device)
    try:
        return run(backend)
    except BaseException as exc:
        if not _falls_back(exc, backend, device):
            raise
        notes.append(_note(backend, what, exc, batched=batched))
        backend.free_cached_memory()
    return run(get_backend("cpu"))


def batches_with_cpu_fallback(
    start: Callable[[Backend, int], Iterator[T]],
    items_in: Callable[[T], int],
    device,
    notes: list[str],
    what: str,
) -> Iterator[T]:
    """The batches of ``start(backend, first_item)``; if the GPU runs out of memory (and
    ``device`` is ``"auto"``), the rest — from the first item not yet delivered — from
    ``start(cpu_backend, done)``. ``items_in(batch)`` is the number of items a batch covers."""
    join_background_warmup()
    backend = get_backend(device)
    done = 0
    try:
        for batch in start(backend, 0):
            done += items_in(batch)
            yield batch
        return
    except BaseException as exc:
        if not _falls_back(exc, backend, device):
            raise
        notes.append(_note(backend, what, exc, done))
        backend.free_cached_memory()
    yield from start(get_backend("cpu"), done)
