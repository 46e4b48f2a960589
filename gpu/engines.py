"""Which implementation of a method runs: the one place that resolves ``engine=``.

A method is computed by one of these engines:

``"kernel"``
    a CUDA kernel of ``gpu/kernels`` (needs the GPU backend);
``"arrays"``
    array operations written against the array module, so they run on NumPy or CuPy;
``"numpy"``
    a NumPy-only reference, for the methods whose CPU path cannot run on CuPy
    (ball & sticks, probabilistic tracking);
``"compiled"``
    a loop compiled for the CPU (numba, the ``cpu`` extra), on threads (deterministic and
    probabilistic tracking).

``"auto"`` picks the kernel on the GPU backend and the method's CPU engine otherwise.

Which *device* ``device="auto"`` means is decided here too, by measured cost
(:func:`decide_device`): the GPU pays a start-up (importing CuPy, compiling or loading its
kernels) that small jobs never earn back, so below a per-method crossover they run on the CPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from . import cuda
from .backend import gpu_status

KERNEL, ARRAYS, NUMPY, COMPILED = "kernel", "arrays", "numpy", "compiled"
AUTO = "auto"
ENGINES = (KERNEL, ARRAYS, NUMPY, COMPILED)


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


# ------------------------------------------------------------------ which device ``auto`` uses
@dataclass(frozen=True)
class MethodCost:
    """What one run of a method costs, in seconds, as a function of its work size ``n``.

    CPU: ``cpu_s_per_unit · n``. GPU: start-up (see :meth:`CostModel.gpu_seconds`) +
    ``gpu_overhead_s`` (allocations, launches, the copies' latency) + ``gpu_s_per_unit · n``
    (computing and moving the data over the bus).
    """

    unit: str
    cpu_s_per_unit: float
    gpu_s_per_unit: float
    gpu_overhead_s: float = 0.05
    compile_s: float = 2.0  # NVRTC, nothing in CuPy's disk cache
    load_s: float = 0.2  # the same builds from the disk cache
    kernel_files: tuple[str, ...] = ()
    #: what the first run in a fresh process costs beyond importing CuPy and the kernels (the
    #: pipeline's other device steps, pools, the field's upload), fitted to whole commands
    first_use_s: float = 0.0


@dataclass(frozen=True)
class GpuState:
    """What the start-up of a GPU run still costs in this process.

    available : a GPU can (presumably) be used; ``reason`` says why not when it cannot.
    imported : CuPy is imported and the device initialised in this process.
    loaded : kernel files already compiled or loaded in this process (:func:`gpu.cuda.loaded_files`).
    warmed : the warm-up (:func:`gpu.warmup.compile_all`) ran in this process.
    cached : CuPy's disk cache holds compiled kernels (a previous run or ``info --compile``).
    """

    available: bool = True
    reason: str = ""
    imported: bool = False
    loaded: frozenset[str] = frozenset()
    warmed: bool = False
    cached: bool = True

    def kernels_ready(self, cost: MethodCost) -> bool:
        if not self.imported:
            return False
        return self.warmed or set(cost.kernel_files) <= self.loaded


@dataclass(frozen=True)
class CostModel:
    """Per-method costs and the one-off price of starting CuPy (import + CUDA context)."""

    methods: Mapping[str, MethodCost]
    import_s: float = 1.6

    def cpu_seconds(self, method: str, n: float) -> float:
        return self.methods[method].cpu_s_per_unit * n

    def startup_seconds(self, method: str, state: GpuState) -> float:
        """What the GPU pays before computing: importing CuPy, then compiling or loading kernels."""
        cost = self.methods[method]
        seconds = 0.0 if state.imported else self.import_s + cost.first_use_s
        if not state.kernels_ready(cost):
            seconds += cost.load_s if state.cached else cost.compile_s
        return seconds

    def gpu_seconds(self, method: str, n: float, state: GpuState) -> float:
        cost = self.methods[method]
        return self.startup_seconds(method, state) + cost.gpu_overhead_s + cost.gpu_s_per_unit * n

    def crossover(self, method: str, state: GpuState) -> float:
        """The work size above which the GPU is the faster (``inf``: never)."""
        cost = self.methods[method]
        gain = cost.cpu_s_per_unit - cost.gpu_s_per_unit
        if gain <= 0:
            return math.inf
        return (self.startup_seconds(method, state) + cost.gpu_overhead_s) / gain


# Fitted by tests/benchmarks/bench_crossover.py on an NVIDIA H100 80GB HBM3 with 16 CPU cores
# (results/crossover_h100_methods.json, crossover_h100_commands.json): per method, least-squares
# lines through in-process CPU and GPU times over two to three decades of work, the kernels'
# cold compiles and cached loads and CuPy's import (0.91-0.98 s this round, 1.53 s in an earlier
# one) in fresh processes. fit-dti and deterministic are fitted to whole ``tractlens`` commands
# too: cpu - gpu over four volumes (fit-dti) and two (deterministic) gives the per-unit gain and
# the GPU's effective start-up of a command; for deterministic tracking that start-up is 3.6 s
# with the kernels cached (the tensor fit and field upload of the GPU pipeline: ``first_use_s``)
# and the whole-brain gain per seed × max step is half the in-process one (streamlines stop
# early on real data), so its constants are the command's. connectome, profile and distance are
# array code compiled by CuPy on first use: their compile/load times are estimates.
DEFAULT_COSTS = CostModel(
    import_s=0.95,
    methods={
        "fit-dti": MethodCost(
            "voxels × measurements",
            4.12e-8,
            2.13e-9,
            gpu_overhead_s=0.0036,
            compile_s=1.62,
            load_s=0.016,
            kernel_files=("dti_fit.cu",),
        ),
        "fit-ballstick": MethodCost(
            "voxels × measurements × iterations",
            7.03e-7,
            3.08e-10,
            gpu_overhead_s=0.007,
            compile_s=5.03,
            load_s=0.026,
            kernel_files=("ballstick.cu",),
        ),
        "deterministic": MethodCost(
            "seeds × max steps",
            4.14e-7,
            2.68e-9,
            gpu_overhead_s=0.040,
            compile_s=1.78,
            load_s=0.014,
            kernel_files=("deterministic.cu", "streamlines.cu"),
            first_use_s=2.7,
        ),
        "geodesic": MethodCost(
            "fibres × max steps",
            3.48e-6,
            3.25e-10,
            gpu_overhead_s=0.0046,
            compile_s=0.86,
            load_s=0.013,
            kernel_files=("geodesic.cu", "streamlines.cu"),
        ),
        # PROVISIONAL CPU rate: the compiled loop (gpu.probabilistic_host, the CPU default with
        # numba) on the HCP-like field of bench_probabilistic_cpu.py, per second of one core's CPU
        # time on a shared 2-core machine (results/probabilistic_cpu.json; 16 free cores would be
        # several times faster); the NumPy reference fitted earlier was 1.3e-5. Refit on the GPU
        # machine: bench_crossover.py --methods probabilistic.
        "probabilistic": MethodCost(
            "streamlines × max steps",
            1.1e-7,
            7.6e-10,
            gpu_overhead_s=0.016,
            compile_s=1.25,
            load_s=0.026,
            kernel_files=("probabilistic.cu",),
        ),
        "commit": MethodCost(
            "segments × iterations",
            5.01e-7,
            7.41e-9,
            gpu_overhead_s=0.177,
            compile_s=0.25,
            load_s=0.014,
            kernel_files=("commit.cu",),
        ),
        "select": MethodCost(
            "streamline points",
            2.03e-7,
            2.15e-9,
            gpu_overhead_s=0.003,
            compile_s=0.12,
            load_s=0.001,
            kernel_files=("select.cu",),
        ),
        # PROVISIONAL, not measured on a GPU yet: the CPU rate is bench_csd.py's MSMT fit of 500
        # voxels x 288 volumes on a shared 2-core machine (1.3e-5 s); the GPU rate is assumed 50x
        # faster until tests/benchmarks/bench_csd.py runs on the H100.
        "fit-csd": MethodCost("voxels × measurements", 1.3e-5, 2.6e-7, gpu_overhead_s=0.05, compile_s=1.0, load_s=0.1),
        "connectome": MethodCost("streamlines", 9.92e-6, 1.74e-7, gpu_overhead_s=0.0089, compile_s=0.5, load_s=0.1),
        # the GPU profile is no faster than the CPU's (3.4e-7 s a point on both): the CPU unless huge
        "profile": MethodCost("streamline points", 3.4e-7, 3.35e-7, gpu_overhead_s=0.0, compile_s=0.5, load_s=0.1),
        "distance": MethodCost("streamline points", 3.2e-6, 6.16e-8, gpu_overhead_s=0.007, compile_s=0.5, load_s=0.1),
    },
)


@dataclass(frozen=True)
class DeviceChoice:
    """The device a run uses and why (``reason`` goes into the result's provenance)."""

    device: str  # "cpu" or "gpu"
    reason: str
    requested: str = AUTO

    @property
    def argument(self) -> str:
        """What to pass on as ``device=``: ``"cpu"`` when the CPU was chosen, else the request
        (``"auto"`` stays ``"auto"``, so a GPU out of memory still falls back to the CPU)."""
        return "cpu" if self.device == "cpu" else self.requested


def gpu_state() -> GpuState:
    """The start-up state of this process, found without importing CuPy."""
    if os.environ.get("TRACTLENS_DISABLE_GPU"):
        return GpuState(available=False, reason="disabled by TRACTLENS_DISABLE_GPU")
    probed = gpu_status.cache_info().currsize > 0
    if probed:
        ok, detail = gpu_status()
        if not ok:
            return GpuState(available=False, reason=detail)
    elif "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return GpuState(available=False, reason="CuPy is not installed")
    try:
        cached = any(os.scandir(cuda.cache_dir()))
    except OSError:
        cached = False
    return GpuState(available=True, imported=probed, loaded=cuda.loaded_files(), warmed=cuda.warmed(), cached=cached)


def _amount(n: float) -> str:
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def decide_device(
    method: str,
    work_size: float | None,
    *,
    requested: str = AUTO,
    cost_model: CostModel | None = None,
    state: GpuState | None = None,
) -> DeviceChoice:
    """The device for ``method`` on ``work_size`` units of work, and why.

    ``"cpu"`` and ``"gpu"`` are obeyed. ``"auto"`` takes the CPU when no GPU can be used,
    else the cheaper of the two by ``cost_model`` (:data:`DEFAULT_COSTS`): below the GPU's
    crossover — its start-up not yet paid, or too little work to repay it — the CPU.
    ``state`` is this process's :func:`gpu_state` unless given.
    """
    if not isinstance(requested, str):  # a resolved backend: obeyed
        return DeviceChoice(requested.name, f"{requested.name}: requested", requested)
    requested = (requested or AUTO).lower()
    if requested in ("cpu", "gpu"):
        return DeviceChoice(requested, f"{requested}: requested", requested)
    model = DEFAULT_COSTS if cost_model is None else cost_model
    state = gpu_state() if state is None else state
    if not state.available:
        return DeviceChoice("cpu", f"cpu: no usable GPU ({state.reason})", requested)
    if work_size is None or method not in model.methods:
        return DeviceChoice("gpu", f"gpu: no cost model for {method}; the GPU when there is one", requested)
    unit = model.methods[method].unit
    cpu_s, gpu_s = model.cpu_seconds(method, work_size), model.gpu_seconds(method, work_size, state)
    when = "warm" if model.startup_seconds(method, state) == 0 else "cold"
    crossover = model.crossover(method, state)
    limit = "never" if math.isinf(crossover) else f"~{_amount(crossover)} {when}"
    size = f"{_amount(work_size)} {unit}"
    if gpu_s < cpu_s:
        return DeviceChoice("gpu", f"gpu: {size}, above the GPU crossover ({limit})", requested)
    return DeviceChoice("cpu", f"cpu: {size}, below the GPU crossover ({limit})", requested)


def choose_device(
    method: str,
    work_size: float | None,
    *,
    requested: str = AUTO,
    cost_model: CostModel | None = None,
    state: GpuState | None = None,
) -> str:
    """``"cpu"`` or ``"gpu"``: :func:`decide_device`'s device."""
    return decide_device(method, work_size, requested=requested, cost_model=cost_model, state=state).device
