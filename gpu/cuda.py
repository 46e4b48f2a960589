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
"""

from __future__ import annotations

import functools
import operator
import re
from pathlib import Path

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
    return module.get_function(name)
