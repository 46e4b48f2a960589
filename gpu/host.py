"""The host CPU as a compute device: how many threads the CPU engines use, and the compiled
loops (numba, the ``cpu`` extra) they run when it is installed.

The CPU engines (:mod:`gpu.commit_host`, :mod:`gpu.deterministic_host`,
:mod:`gpu.probabilistic_host`) split their work over
threads that run compiled loops without the GIL. numba is optional: without it the same
engines run NumPy array operations over the same blocks (correct, several times slower), and
:func:`compiled_note` says so once per job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

#: Environment variable that caps the CPU engines' threads (default: the cores this process may use)
THREADS_ENV = "TRACTLENS_THREADS"
#: The optional dependency that compiles the CPU engines' loops, and how to install it
NUMBA_HINT = "pip install 'tractlens[cpu]' (numba) makes the CPU engines several times faster"


def host_threads() -> int:
    """Threads of the CPU engines: ``TRACTLENS_THREADS`` when set, else the cores this process
    may run on (its affinity: ``taskset`` and container limits are honoured)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            log.warning("%s=%r is not a number of threads: ignored", THREADS_ENV, value)
    return host_cores()


def host_cores() -> int:
    """The cores this process may run on (its affinity: ``taskset``, container limits and a batch
    worker's pinning honoured); all of the machine's where the system cannot say."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def numba_module():
    """numba, or None when it is not installed (the ``cpu`` extra) or disabled by
    ``TRACTLENS_DISABLE_NUMBA`` (to run the NumPy fallback on purpose)."""
    if os.environ.get("TRACTLENS_DISABLE_NUMBA"):
        return None
    try:
        import numba
    except ImportError:
        log.info("numba is not installed: the CPU engines run NumPy loops (%s)", NUMBA_HINT)
        return None
    return numba


def numba_installed() -> bool:
    """Whether :func:`numba_module` would give numba, found without importing it (its import
    takes ~0.3 s: a job that may not need it should not pay that to decide)."""
    if os.environ.get("TRACTLENS_DISABLE_NUMBA"):
        return False
    import importlib.util

    return "numba" in sys.modules or importlib.util.find_spec("numba") is not None


def compiled_note() -> str | None:
    """A note for a job's result when its CPU engine runs without compiled loops, else None."""
    if numba_module() is not None:
        return None
    return f"the CPU engine ran without numba (slower): {NUMBA_HINT}"


_started = threading.Event()  # set once a compiled loop has run in this process


def compiled_started() -> bool:
    """Whether a compiled loop of the CPU engines has run in this process, so numba's start
    (its import and CPU target: ~0.5 s on a 2-core machine, more on a large one) is paid and the
    next loop loads from numba's cache in milliseconds."""
    return _started.is_set()


def compile_or_uncached(loops, first_call, module: str):
    """``loops()`` (numba functions of ``gpu.<module>``) after ``first_call(loops())`` compiled
    them (an empty call: nothing computed). numba writes what it compiles to a cache on disk;
    when that write fails (a full disk, a file-size limit) the module's functions stop caching
    and are compiled in memory, rather than failing the job."""
    try:
        first_call(loops())
    except OSError as exc:
        import importlib

        from numba.core.caching import NullCache

        log.warning("numba could not cache the CPU engine's compiled loops (%s): compiled without the cache", exc)
        for value in vars(importlib.import_module(f"{__package__}.{module}")).values():
            if hasattr(value, "_cache") and hasattr(value, "py_func"):  # a numba dispatcher
                value._cache = NullCache()
        first_call(loops())
    _started.set()
    return loops()


def release_freed_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``); True when
    some were. Arrays of a few MB (a chunk's segments, say), once freed, stay in the process's heap
    and count in its resident memory until reused: after the many chunks of a cut, as many
    bytes as the segments themselves. Does nothing on another C library."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def run_parallel(tasks, threads: int) -> list:
    """``[task() for task in tasks]``, on ``threads`` threads (inline for one): the tasks run
    compiled loops that release the GIL, or NumPy operations that mostly do."""
    tasks = list(tasks)
    if threads <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    return list(_pool(threads).map(lambda task: task(), tasks))


def run_in_order(tasks, threads: int):
    """The results of ``tasks`` (an iterable of callables), in their order, computed on
    ``threads`` threads of their own with at most ``threads`` submitted and not yet taken (so at
    most that many tasks' working memory at once); inline for one thread. The iterable is
    consumed lazily: a caller can stop (or raise) between results, and what was not started is
    not run."""
    if threads <= 1:
        for task in tasks:
            yield task()
        return
    from collections import deque

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tractlens-ordered") as pool:
        pending = deque()
        try:
            for task in tasks:
                pending.append(pool.submit(task))
                if len(pending) >= threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


@contextlib.contextmanager
def one_blas_thread():
    """BLAS and OpenMP pools held to one thread while several of our threads each call them
    (threadpoolctl, the ``cpu`` extra): without it each call would start every core's BLAS
    thread. A no-op (logged once) without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        _warn_no_threadpoolctl()
        yield
        return
    with threadpool_limits(limits=1):
        yield


@functools.lru_cache(maxsize=1)
def _warn_no_threadpoolctl() -> None:
    log.warning("threadpoolctl is not installed: BLAS is not held to one thread per CPU-engine thread (%s)",
                "pip install 'tractlens[cpu]'")  # fmt: skip


def thread_pool(threads: int) -> ThreadPoolExecutor:
    """The CPU engines' pool of ``threads`` threads (kept between calls), for work whose caller
    waits on the futures itself (to poll a cancellation between blocks)."""
    return _pool(threads)


@functools.lru_cache(maxsize=4)
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept (FISTA calls its products hundreds of times)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tractlens-cpu")
