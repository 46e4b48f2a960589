"""The engine's CUDA kernels: C++ sources in ``gpu/kernels``, compiled once per process by
CuPy (NVRTC) and cached. A source whose first line is ``typedef ... real;`` sets the
precision of the headers it uses (``sym3.cuh``, ``tracking.cuh``); the headers are
inserted after that line."""

from __future__ import annotations

import functools
from pathlib import Path

KERNEL_DIR = Path(__file__).parent / "kernels"


def source(file: str, headers: tuple[str, ...] = ()) -> str:
    """The compilable text of ``kernels/<file>`` with ``headers`` inserted after its precision line."""
    text = (KERNEL_DIR / file).read_text()
    first, _, rest = text.partition("\n")
    prefix, body = (first + "\n", rest) if first.startswith("typedef") else ("", text)
    return prefix + "".join((KERNEL_DIR / h).read_text() for h in headers) + body


@functools.cache
def function(file: str, name: str, headers: tuple[str, ...] = (), defines: tuple[tuple[str, int], ...] = ()):
    """The ``extern "C"`` kernel ``name`` of ``kernels/<file>`` (compiled on first use).

    ``defines`` are compile-time constants ``(NAME, value)`` (``-DNAME=value``); each
    combination is compiled once."""
    import cupy

    options = ("--std=c++17", *(f"-D{key}={value}" for key, value in defines))
    module = cupy.RawModule(code=source(file, headers), options=options)
    return module.get_function(name)
