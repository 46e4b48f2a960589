"""Compute backend selection: CuPy on a usable CUDA device, NumPy otherwise.

Every engine function takes ``device="auto" | "cpu" | "gpu"`` and resolves it
with :func:`get_backend`. The returned :class:`Backend` bundles the array module
(``xp``), a readable device name, free-memory queries, host/device transfers and
a batch-size helper, so the numerical code above it is written once against
``xp`` and runs on either.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .transfer import to_host

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "gpu")
T = TypeVar("T")


class BackendError(RuntimeError):
    """The requested compute device cannot be used (e.g. ``gpu`` forced, no CUDA)."""


class OutOfDeviceMemory(MemoryError):
    """Raised when work does not fit even after the batch was halved to one item."""


@dataclass(frozen=True)
class Backend:
    """A resolved compute backend.

    Attributes
    ----------
    name : ``"cpu"`` or ``"gpu"``.
    xp : the array module (``numpy`` or ``cupy``).
    device_name : human-readable device, e.g. ``"NVIDIA H100 80GB HBM3"``.
    device_id : the CUDA device (0 unless :func:`gpu_backends` made it for another GPU).
    """

    name: str
    xp: Any
    device_name: str
    device_id: int = 0

    def activate(self):
        """A context in which this backend's GPU is CUDA's current device (arrays, kernels and
        memory queries then go to it); nothing on the CPU. Threads each keep their own."""
        if self.is_gpu:
            return self.xp.cuda.Device(self.device_id)
        return contextlib.nullcontext()

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    def asarray(self, array, dtype=None):
        """Copy a host array to the device (no copy on the CPU backend)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_host(self, array) -> np.ndarray:
        """Bring an array back to host memory as a NumPy array."""
        if self.is_gpu:
            return to_host(array)
        return np.asarray(array)

    def synchronize(self) -> None:
        if self.is_gpu:
            self.xp.cuda.Device().synchronize()

    def free_memory_bytes(self) -> int:
        """Bytes that new allocations can still use on this device.

        On the GPU this is the driver's free memory plus what CuPy's pool holds
        but does not use; on the CPU it is the kernel's MemAvailable.
        """
        if self.is_gpu:
            free, _total = self.xp.cuda.runtime.memGetInfo()
            pool = self.xp.get_default_memory_pool()
            available = int(free + pool.free_bytes())
            limit = pool.get_limit()  # 0: none (set_limit caps what the pool may hold)
            return min(available, max(0, limit - pool.used_bytes())) if limit else available
        return _host_available_bytes()

    def total_memory_bytes(self) -> int:
        if self.is_gpu:
            return int(self.xp.cuda.runtime.memGetInfo()[1])
        return _host_total_bytes()

    def batch_size(
        self,
        n_items: int,
        bytes_per_item: int,
        *,
        fraction: float = 0.5,
        minimum: int = 1,
        maximum: int | None = None,
    ) -> int:
        """How many items to process at once so the work fits in free memory.

        ``bytes_per_item`` is the peak working memory one item needs (inputs,
        intermediates and outputs together). Only ``fraction`` of the free
        memory is planned for, leaving room for the allocator and other users.
        """
        if n_items <= 0:
            return 0
        budget = int(self.free_memory_bytes() * fraction)
        size = max(minimum, budget // max(1, int(bytes_per_item)))
        if maximum is not None:
            size = min(size, maximum)
        return int(min(n_items, size))

    def free_cached_memory(self) -> None:
        if self.is_gpu:
            self.xp.get_default_memory_pool().free_all_blocks()

    def is_out_of_memory(self, exc: BaseException) -> bool:
        if isinstance(exc, MemoryError):
            return True
        if self.is_gpu:
            return isinstance(exc, self.xp.cuda.memory.OutOfMemoryError)
        return False


def _host_meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _host_available_bytes() -> int:
    value = _host_meminfo("MemAvailable")
    if value is None:  # not Linux: assume a modest 4 GiB rather than failing
        value = 4 << 30
    return value


def _host_total_bytes() -> int:
    value = _host_meminfo("MemTotal")
    return value if value is not None else 8 << 30


#: Called with the ``cupy`` module once, after CuPy is imported and before it compiles its first
#: kernel (:func:`gpu_status`); the application installs the kernels shipped with TractLens into
#: CuPy's cache there (:mod:`app.kernel_cache`). A failing hook is logged, never raised.
_cupy_import_hooks: list[Callable[[Any], None]] = []


def on_cupy_import(hook: Callable[[Any], None]) -> None:
    """Register ``hook(cupy)`` to run before CuPy's first kernel in this process (once each)."""
    if hook not in _cupy_import_hooks:
        _cupy_import_hooks.append(hook)


def _run_cupy_import_hooks(cupy) -> None:
    for hook in _cupy_import_hooks:
        try:
            hook(cupy)
        except Exception as exc:  # the hooks save time; a broken one must not cost the GPU
            log.warning("GPU start-up hook %s failed: %s", getattr(hook, "__qualname__", hook), exc)


#: ``1`` keeps CuPy's CUB block reductions (:func:`_one_kernel_per_reduction`), as CuPy has them.
ENV_CUB_BLOCK_REDUCTION = "TRACTLENS_CUB_BLOCK_REDUCTION"


def _one_kernel_per_reduction(cupy) -> None:
    """Turn off CuPy's CUB *block* reductions (its ``cub`` reduction accelerator), so that a
    reduction compiles one kernel whatever the size of its data.

    With it on, CuPy reduces a contiguous run of 128 or more elements (``mask.sum()`` over the
    seeds, a maximum over the measurements...) with a CUB kernel compiled by NVRTC for a block
    size taken from the run's length (32 to 512 threads), and shorter runs with its generic
    reduction: the same command then compiles other kernels on data of another size, which
    neither the shipped kernels (:mod:`app.kernel_cache`) nor the first-start rehearsal can
    all prepare. CuPy's generic reduction has one block size. CuPy's device-wide CUB routines
    (float and 64-bit integer sums, segmented sums, prefix sums), compiled into CuPy itself,
    stay on. ``TRACTLENS_CUB_BLOCK_REDUCTION=1`` keeps CuPy's choice."""
    if os.environ.get(ENV_CUB_BLOCK_REDUCTION, "0").strip().lower() in ("1", "yes", "true", "on"):
        return
    core = cupy._core
    cub = 1  # cupy._core._accelerator.ACCELERATOR_CUB
    kept = [a for a in core.get_reduction_accelerators() if a not in (cub, "cub")]
    core.set_reduction_accelerators(kept)


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """Whether a CUDA device is usable, and its name or the reason it is not."""
    if os.environ.get("TRACTLENS_DISABLE_GPU"):
        return False, "disabled by TRACTLENS_DISABLE_GPU"
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install 'tractlens[gpu]')"
    except Exception as exc:  # a broken CuPy install must not break the CPU path
        return False, f"CuPy failed to import: {exc}"
    try:
        _one_kernel_per_reduction(cupy)
    except Exception as exc:  # an older or newer CuPy without these switches: its own choice
        log.info("CuPy's reduction accelerators were left as they are: %s", exc)
    try:
        if cupy.cuda.runtime.getDeviceCount() >= 1:
            _run_cupy_import_hooks(cupy)
    except Exception:  # no driver or device: said below
        pass
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return False, "no CUDA device found"
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        # A tiny kernel proves the driver, runtime and compiler work together.
        (cupy.arange(4, dtype=cupy.float32) * 2).sum().item()
        return True, name
    except Exception as exc:
        return False, f"CUDA device not usable: {exc}"


def get_backend(device: str | Backend = "auto") -> Backend:
    """Resolve ``device`` (``"auto"``, ``"cpu"`` or ``"gpu"``) to a :class:`Backend`.

    ``"auto"`` picks the GPU when one is usable. ``"gpu"`` raises
    :class:`BackendError` with the reason when no device can be used.
    """
    if isinstance(device, Backend):
        return device
    device = (device or "auto").lower()
    if device not in DEVICES:
        raise BackendError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return _cpu_backend()
    ok, detail = gpu_status()
    if ok:
        import cupy

        return Backend("gpu", cupy, detail)
    if device == "gpu":
        raise BackendError(
            f"a GPU was requested but none can be used: {detail}. "
            "Run with --device cpu (or auto) to compute on the CPU."
        )
    log.info("no usable GPU (%s); computing on the CPU", detail)
    return _cpu_backend()


def gpu_count() -> int:
    """How many CUDA devices there are (0 without a usable GPU)."""
    ok, _detail = gpu_status()
    if not ok:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def gpu_backends(n: int | None = None) -> list[Backend]:
    """One backend per GPU, the first ``n`` (all when None); each names its device, as
    ``NVIDIA H200 (GPU 1)``, so caches kept per device stay apart. Refuses more than there are."""
    count = gpu_count()
    n = count if n is None else int(n)
    if n < 1 or n > count:
        ok, detail = gpu_status()
        why = f"{count} GPU(s) here" if ok else detail
        raise BackendError(f"{n} GPU(s) asked for, {why}")
    import cupy

    backends = []
    for i in range(n):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        backends.append(Backend("gpu", cupy, f"{name} (GPU {i})" if count > 1 else name, device_id=i))
    return backends


def check_device(device: str | Backend) -> None:
    """Refuse an unusable request before any work: an unknown name, or ``"gpu"`` with no GPU
    (:class:`BackendError`). ``"auto"`` and ``"cpu"`` are not probed, so CuPy is not imported
    for work the device chooser may give to the CPU."""
    if isinstance(device, Backend):
        return
    name = (device or "auto").lower()
    if name not in DEVICES:
        raise BackendError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if name == "gpu":
        get_backend(name)


def _cpu_backend() -> Backend:
    return Backend("cpu", np, platform.processor() or platform.machine() or "CPU")


def run_batched(
    backend: Backend,
    n_items: int,
    bytes_per_item: int,
    process: Callable[[int, int], None],
    *,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    fraction: float = 0.5,
    maximum: int | None = None,
    threads: int | None = None,
) -> None:
    """Call ``process(start, stop)`` over ``range(n_items)`` in memory-sized batches.

    On out-of-memory the batch is halved and the same range retried; only a
    batch of one item that still fails raises :class:`OutOfDeviceMemory`.
    ``cancelled()`` is checked between batches; when it returns true the loop
    raises :class:`Cancelled`.

    ``threads`` > 1 on the CPU: that many batches at once on host threads (NumPy releases the
    GIL in the array work), each sized for its share of the memory budget and at most
    ``n_items / threads`` so that every thread has one, with BLAS held to one thread
    (:func:`gpu.host.one_blas_thread`); ``process`` must write disjoint results (its own rows)
    and be thread-safe otherwise. ``progress`` is called in batch order, from this thread.
    """
    if threads is not None and threads > 1 and not backend.is_gpu and n_items > 1:
        _run_on_host_threads(backend, n_items, bytes_per_item, process, progress, cancelled, fraction, maximum, threads)
        return
    for _ in iter_batched(
        backend,
        n_items,
        bytes_per_item,
        process,
        progress=progress,
        cancelled=cancelled,
        fraction=fraction,
        maximum=maximum,
    ):
        pass


def _run_on_host_threads(backend, n_items, bytes_per_item, process, progress, cancelled, fraction, maximum, threads):
    """:func:`run_batched` with ``threads`` batches at once on the CPU."""
    from .host import one_blas_thread, run_in_order

    batch = backend.batch_size(n_items, bytes_per_item * threads, fraction=fraction, maximum=maximum)
    batch = max(1, min(batch, -(-n_items // threads)))

    def tasks():
        for start in range(0, n_items, batch):
            if cancelled is not None and cancelled():
                raise Cancelled()
            stop = min(n_items, start + batch)
            yield lambda a=start, b=stop: (process(a, b), b)[1]

    with one_blas_thread():
        for stop in run_in_order(tasks(), threads):
            if progress is not None:
                progress(stop, n_items)


def iter_batched(
    backend: Backend,
    n_items: int,
    bytes_per_item: int,
    work: Callable[[int, int], T],
    *,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    fraction: float = 0.5,
    maximum: int | None = None,
    first: int | None = None,
):
    """Like :func:`run_batched`, but a generator of ``work(start, stop)``'s results, one per
    batch, so callers can hand partial results on while the rest is computed. ``first``
    makes the first batch at most that large, so the first results come back sooner."""
    batch = backend.batch_size(n_items, bytes_per_item, fraction=fraction, maximum=maximum)
    start = 0
    while start < n_items:
        if cancelled is not None and cancelled():
            raise Cancelled()
        size = min(batch, first) if (first and start == 0) else batch
        stop = min(n_items, start + size)
        try:
            result = work(start, stop)
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
            if batch == 1:
                raise OutOfDeviceMemory(
                    f"{backend.device_name} ran out of memory even for one item "
                    f"(about {bytes_per_item / 2**20:.1f} MiB needed)"
                ) from exc
            batch = max(1, min(batch, size) // 2)
            log.warning("out of memory on %s: retrying with batches of %d", backend.device_name, batch)
            continue
        start = stop
        yield result
        if progress is not None:
            progress(start, n_items)


class Cancelled(Exception):
    """The user cancelled a running computation; partial results stay valid."""


def flag_counts(flags: np.ndarray, names: dict[int, str]) -> dict[str, int]:
    """How many voxels of a fit carry each flag bit of ``names`` (bit -> name), by name, in the
    order of ``names`` and only for the flags that occur."""
    counts = {}
    for bit, name in names.items():
        n = int(np.count_nonzero(flags & bit))
        if n:
            counts[name] = n
    return counts
