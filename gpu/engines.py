"""Which implementation of a method runs: the one place that resolves ``engine=``.

A method is computed by one of these engines:

``"kernel"``
    a CUDA kernel of ``gpu/kernels`` (needs the GPU backend);
``"arrays"``
    array operations written against the array module, so they run on NumPy or CuPy;
``"numpy"``
    a NumPy-only reference, for the methods whose CPU path cannot run on CuPy
    (ball & sticks, probabilistic tracking).

``"auto"`` picks the kernel on the GPU backend and the method's CPU engine otherwise.
"""

from __future__ import annotations

from typing import Protocol

KERNEL, ARRAYS, NUMPY = "kernel", "arrays", "numpy"
AUTO = "auto"
ENGINES = (KERNEL, ARRAYS, NUMPY)


class _HasDevice(Protocol):
    @property
    def is_gpu(self) -> bool: ...


def engine_names(available: tuple[str, ...] = (KERNEL, ARRAYS)) -> tuple[str, ...]:
    """What ``engine=`` accepts for a method offering ``available``: ``"auto"`` and those."""
    return (AUTO, *available)


def choose_engine(
    requested: str,
    backend: _HasDevice,
    *,
    available: tuple[str, ...] = (KERNEL, ARRAYS),
    method: str = "this method",
) -> str:
    """The engine that runs ``method`` on ``backend``: ``requested`` checked, or ``"auto"`` resolved.

    Parameters
    ----------
    requested : ``"auto"`` or one of ``available``.
    backend : the resolved :class:`gpu.backend.Backend` (anything with ``is_gpu``).
    available : the engines the method implements, the kernel (if any) first.
    method : the method's name, for the error message.

    Raises
    ------
    ValueError
        ``requested`` is not an engine of the method, or is ``"kernel"`` on the CPU backend.
    """
    unknown = [name for name in available if name not in ENGINES]
    if unknown or not available:
        raise ValueError(f"engines must be among {', '.join(ENGINES)}; got {available!r}")
    cpu_engines = [name for name in available if name != KERNEL]
    if requested == AUTO:
        if backend.is_gpu and KERNEL in available:
            return KERNEL
        if not cpu_engines:
            raise ValueError(f"{method} has only the 'kernel' engine, which needs the GPU backend")
        return cpu_engines[0]
    if requested not in available:
        choices = ", ".join(repr(name) for name in engine_names(available))
        raise ValueError(f"unknown engine {requested!r} for {method}: use one of {choices}")
    if requested == KERNEL and not backend.is_gpu:
        hint = f"; use engine={cpu_engines[0]!r} or 'auto' on the CPU" if cpu_engines else ""
        raise ValueError(f"the 'kernel' engine needs the GPU backend (CuPy and a CUDA device) for {method}{hint}")
    return requested
