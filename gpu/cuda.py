"""The engine's CUDA kernels: C++ sources in ``gpu/kernels``, compiled once per process by
CuPy (NVRTC) and cached. A source whose first line is ``typedef ... real;`` sets the
precision of the headers it uses (``sym3.cuh``, ``tracking.cuh``); the headers are
inserted after that line.

Integers that Python and a kernel share (stop codes, region bits, fit flags, random
stream purposes, sizes) are defined once, in the Python module that wraps the kernel,
and reach the kernel as compile-time defines (``-DNAME=value``). A kernel declares
each one it needs with::

    #ifndef NAME
    #error "NAME is defined by gpu/<module>.py"
    #endif

so a missing define stops compilation, and :func:`function` refuses, before compiling,
a call that does not pass every such name (:func:`required_defines`).

Compiling is slow the first time (NVRTC, about a second a build) and fast afterwards: CuPy
keeps every compiled build in its on-disk cache (``CUPY_CACHE_DIR``, by default
``~/.cupy/kernel_cache``, :func:`cache_dir`), keyed by source, options and GPU, so we pass
the same text and options each time and never move it. When the first build of a process
takes longer than :data:`SLOW_COMPILE_S` (nothing was cached) the logger says so once, while
it happens. :func:`loaded_files` tells which kernels this process already holds (the
device chooser counts their start-up as paid).
"""

from __future__ import annotations

import functools
import logging
import operator
import os
import re
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).parent / "kernels"

#: ``#ifndef NAME`` directly followed by ``#error``: a define the kernel needs from Python.
_REQUIRED = re.compile(r"^[ \t]*#[ \t]*ifndef[ \t]+(\w+)[ \t]*\n[ \t]*#[ \t]*error\b", re.MULTILINE)


def source(file: str, headers: tuple[str, ...] = ()) -> str:
    """The compilable text of ``kernels/<file>`` with ``headers`` inserted after its precision line."""
    text = (KERNEL_DIR / file).read_text()
    first, _, rest = text.partition("\n")
    prefix, body = (first + "\n", rest) if first.startswith("typedef") else ("", text)
    return prefix + "".join((KERNEL_DIR / h).read_text() for h in headers) + body


@functools.cache
def required_defines(file: str, headers: tuple[str, ...] = ()) -> frozenset[str]:
    """The names ``kernels/<file>`` (with ``headers``) must receive as defines (its ``#ifndef``/``#error`` guards)."""
    return frozenset(_REQUIRED.findall(source(file, headers)))


def check_defines(file: str, headers: tuple[str, ...], defines: tuple[tuple[str, int], ...]) -> None:
    """Raise ``ValueError`` naming the defines ``kernels/<file>`` needs that ``defines`` lacks,
    or any value that is not an integer."""
    names = [key for key, _ in defines]
    missing = sorted(required_defines(file, headers) - set(names))
    if missing:
        raise ValueError(f"kernels/{file} needs the compile-time constants {', '.join(missing)}; pass them in defines")
    for key, value in defines:
        try:
            operator.index(value)
        except TypeError:
            raise ValueError(f"the define {key}={value!r} for kernels/{file} must be an integer") from None


#: Seconds a compile may take before the log says that kernels are being compiled.
SLOW_COMPILE_S = 0.5
#: The message, logged at INFO once per process (the CLI prints it on stderr).
COMPILING_MESSAGE = "compiling GPU kernels (first use only)…"

_loaded: dict[str, float] = {}  # kernel file -> seconds its builds took in this process
_announce = threading.Lock()
_announced = False
_warmed = False


def cache_dir() -> Path:
    """Where CuPy keeps compiled kernels between processes (``CUPY_CACHE_DIR`` or its default)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


def loaded_files() -> frozenset[str]:
    """The kernel files of which at least one build was compiled (or loaded) in this process."""
    return frozenset(_loaded)


def mark_warmed() -> None:
    """Record that every kernel build of the engine was compiled or loaded here
    (:func:`gpu.warmup.compile_all` ran to the end)."""
    global _warmed
    _warmed = True


def warmed() -> bool:
    """Whether :func:`gpu.warmup.compile_all` ran to the end in this process."""
    return _warmed


def _say_compiling() -> None:
    global _announced
    with _announce:
        if not _announced:
            _announced = True
            log.info("%s", COMPILING_MESSAGE)


def _timed_build(file: str, build):
    """``build()``, saying :data:`COMPILING_MESSAGE` if it is still running after
    :data:`SLOW_COMPILE_S` (a cached build loads in milliseconds and says nothing)."""
    timer = None if _announced else threading.Timer(SLOW_COMPILE_S, _say_compiling)
    if timer is not None:
        timer.daemon = True
        timer.start()
    start = time.perf_counter()
    try:
        return build()
    finally:
        if timer is not None:
            timer.cancel()
        _loaded[file] = _loaded.get(file, 0.0) + time.perf_counter() - start


@functools.cache
def function(file: str, name: str, headers: tuple[str, ...] = (), defines: tuple[tuple[str, int], ...] = ()):
    """The ``extern "C"`` kernel ``name`` of ``kernels/<file>`` (compiled on first use).

    ``defines`` are compile-time constants ``(NAME, value)`` (``-DNAME=value``), at least
    every name the source requires (:func:`required_defines`); each combination is
    compiled once."""
    check_defines(file, headers, defines)
    import cupy

    options = ("--std=c++17", *(f"-D{key}={operator.index(value)}" for key, value in defines))
    module = cupy.RawModule(code=source(file, headers), options=options)
    return _timed_build(file, lambda: module.get_function(name))
