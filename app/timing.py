"""Where a command's time goes: named phases (read, compute, write) and memory high-water marks.

A process-wide :class:`PhaseRecorder` collects the seconds spent in each phase. Commands and
pipelines mark their steps with ``with phase("read"): ...``; nothing is printed, the totals are
read with :func:`timings` (the CLI puts them in its ``--json`` summary under ``timings`` and, when
``$TRACTLENS_TIMINGS`` names a file, writes them there for the whole-command benchmark).

Time is *exclusive*: a phase opened inside another (a mask read during a fit) takes its seconds
out of the outer one, so the phases of one thread add up to at most its wall time and never count
a second twice. Each thread keeps its own stack of open phases; totals from several threads add
up (they can exceed the wall time when threads overlap).

At every phase boundary the recorder samples two cheap counters: the process's peak resident
memory (``getrusage``, one system call) and, only when CuPy is already imported, the bytes its
default memory pool holds. The pool keeps the blocks it has allocated until asked to free them
(the engines do so only when retrying after running out of memory), so its size at the end of a
phase is that phase's device high-water mark as far as CuPy's allocations go (the CUDA context
and compiled kernels are not in the pool; measure those with ``nvidia-smi``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Environment variable naming a file the CLI writes its timings to (JSON) when a command ends.
TIMINGS_ENV = "TRACTLENS_TIMINGS"

__all__ = ["TIMINGS_ENV", "PhaseRecorder", "phase", "recorder", "timings", "write_timings"]


def host_peak_rss_bytes() -> int | None:
    """The process's peak resident set size so far (Linux/macOS), or ``None``."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def device_pool_bytes() -> int | None:
    """Bytes CuPy's default memory pool holds on the current device; ``None`` when CuPy was
    never imported (no GPU work: importing it here would cost a second) or has no device."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        return int(cupy.get_default_memory_pool().total_bytes())
    except Exception:  # no CUDA device or driver: nothing to report
        return None


class PhaseRecorder:
    """Exclusive seconds per named phase, with the memory high-water marks seen at their ends.

    Thread-safe: every thread has its own stack of open phases; totals are merged under a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.reset()

    def reset(self) -> None:
        """Forget every phase and restart the clock of :meth:`snapshot`'s ``total_s``."""
        with self._lock:
            self._seconds: dict[str, float] = {}
            self._counts: dict[str, int] = {}
            self._host_peak: dict[str, int] = {}
            self._device_peak: dict[str, int] = {}
            self._details: dict[str, dict[str, float]] = {}
            self._started = time.perf_counter()
            self._cpu_started = time.process_time()
        self._local = threading.local()

    def _stack(self) -> list[list]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def detail(self, name: str, seconds: dict[str, float]) -> None:
        """Add the stages of a part of the work (``{"world": 1.2, "flush": 0.4}``, e.g. a writer's
        own thread's, which overlap the phases) to ``details_s[name]`` of :meth:`snapshot`."""
        with self._lock:
            into = self._details.setdefault(name, {})
            for key, value in seconds.items():
                into[key] = into.get(key, 0.0) + float(value)

    def _sample(self, name: str) -> None:
        host, device = host_peak_rss_bytes(), device_pool_bytes()
        with self._lock:
            if host is not None:
                self._host_peak[name] = max(self._host_peak.get(name, 0), host)
            if device is not None:
                self._device_peak[name] = max(self._device_peak.get(name, 0), device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time of the ``with`` block to ``name`` (minus phases opened inside it)."""
        stack = self._stack()
        now = time.perf_counter()
        if stack:  # the enclosing phase pauses
            outer = stack[-1]
            self._add(outer[0], now - outer[1])
        frame = [name, now]
        stack.append(frame)
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
        try:
            yield
        finally:
            now = time.perf_counter()
            stack.pop()
            self._add(name, now - frame[1])
            if stack:  # the enclosing phase resumes
                stack[-1][1] = now
            self._sample(name)

    def snapshot(self) -> dict:
        """The totals so far: ``phases_s`` (exclusive seconds per phase), ``calls``, ``total_s``
        (since :meth:`reset`), ``unattributed_s`` (total minus the phases), ``cpu_s`` (the CPU
        seconds of the whole process since then, all its threads, user and system: with
        ``total_s``, how many cores the work kept busy), the peak host RSS and device-pool bytes at
        the end of each phase and overall (``None`` where not measured)."""
        host, device = host_peak_rss_bytes(), device_pool_bytes()
        with self._lock:
            total = time.perf_counter() - self._started
            cpu = time.process_time() - self._cpu_started
            phases = dict(self._seconds)
            device_peaks = dict(self._device_peak)
            details = {k: {s: round(v, 6) for s, v in d.items()} for k, d in self._details.items()}
            if device is not None:
                device_peaks["end"] = max(device_peaks.get("end", 0), device)
            return {
                "phases_s": {k: round(v, 6) for k, v in phases.items()},
                "calls": dict(self._counts),
                "total_s": round(total, 6),
                "unattributed_s": round(max(0.0, total - sum(phases.values())), 6),
                "cpu_s": round(cpu, 6),
                "host_peak_rss_bytes": host,
                "host_peak_rss_bytes_by_phase": dict(self._host_peak),
                "device_pool_peak_bytes": max(device_peaks.values()) if device_peaks else None,
                "device_pool_peak_bytes_by_phase": device_peaks,
                "details_s": details,
            }


_RECORDER = PhaseRecorder()


def recorder() -> PhaseRecorder:
    """The process-wide recorder that :func:`phase` feeds."""
    return _RECORDER


def phase(name: str):
    """``with phase("read"): ...``: count the block's time to ``name`` on the process-wide recorder."""
    return _RECORDER.phase(name)


def timings() -> dict:
    """The process-wide recorder's :meth:`PhaseRecorder.snapshot`."""
    return _RECORDER.snapshot()


def write_timings(path: str | os.PathLike | None = None, extra: dict | None = None) -> Path | None:
    """Write :func:`timings` (plus ``extra``) as JSON to ``path``, default ``$TRACTLENS_TIMINGS``;
    nothing when neither names a file. Returns the path written."""
    target = path if path is not None else os.environ.get(TIMINGS_ENV)
    if not target:
        return None
    target = Path(target)
    payload = {**timings(), **(extra or {})}
    tmp = target.with_name(target.name + ".part")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, target)
    return target
