"""Every CUDA kernel build the engine uses, and :func:`compile_all` to compile them ahead of use.

A build is a kernel file, a kernel name, the headers inserted and the compile-time defines
(:mod:`gpu.cuda`); each method module computes its own defines, and :func:`catalogue` asks
them. Defines that depend on the data (measurements per lane for ball & sticks' MCMC and
COMMIT) are taken for ``n_measurements`` (65 by default: 64 directions and a b=0, the common
single-shell protocol); other data compile their own build at first use.

Compiling fills CuPy's on-disk cache (:func:`gpu.cuda.cache_dir`), so after one warm-up, in any
process, each build loads in milliseconds. :func:`compile_all` is what ``tractlens info
--compile`` and the window's background warm-up run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from . import (
    ballstick,
    commit,
    commit_device,
    cuda,
    deterministic,
    dti,
    fod_tracking,
    geodesic,
    probabilistic_kernel,
)

#: Measurements assumed for the data-dependent defines (64 directions + b=0).
DEFAULT_MEASUREMENTS = 65


@dataclass(frozen=True)
class KernelBuild:
    """One compilation: ``kernels/<file>``'s ``name`` with ``headers`` and ``defines``."""

    method: str
    file: str
    name: str
    headers: tuple[str, ...] = ()
    defines: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.file}:{self.name}"

    def compile(self):
        """The compiled kernel (compiled once per process; from CuPy's disk cache when there)."""
        return cuda.function(self.file, self.name, self.headers, self.defines)


@dataclass(frozen=True)
class CompiledBuild:
    """A build and the seconds it took here (milliseconds: it came from the cache)."""

    build: KernelBuild
    seconds: float


def catalogue(n_measurements: int = DEFAULT_MEASUREMENTS) -> tuple[KernelBuild, ...]:
    """Every kernel build the engine's methods use with their default parameters."""
    geodesic_headers = ("sym3.cuh", "tracking.cuh")
    bs = ballstick.BallStickParams()
    builds = [
        KernelBuild("fit-dti", "dti_fit.cu", "dti_fit_float32", ("sym3.cuh",), dti.KERNEL_DEFINES),
        KernelBuild("fit-dti", "dti_fit.cu", "dti_fit_float64", ("sym3.cuh",), dti.KERNEL_DEFINES),
        KernelBuild(
            "deterministic",
            "deterministic.cu",
            "track_deterministic",
            deterministic.KERNEL_HEADERS,
            deterministic.KERNEL_DEFINES,
        ),
        KernelBuild("geodesic", "geodesic.cu", "geodesic_trace", geodesic_headers, geodesic.KERNEL_DEFINES),
        KernelBuild("select", "select.cu", "streamline_region_bits"),
        KernelBuild("tracking", "streamlines.cu", "pack_rows"),
        *(
            KernelBuild(
                "probabilistic",
                "probabilistic.cu",
                "prob_track",
                ("philox.cuh",),
                probabilistic_kernel.kernel_defines(m, v),
            )
            for m, v in ((False, False), (True, False), (False, True))  # plain, --seed-matrix, connectome modes
        ),
        KernelBuild(
            "fod-tracking",
            "fod_tracking.cu",
            "track_fod",
            fod_tracking.KERNEL_HEADERS,
            fod_tracking.KERNEL_DEFINES,
        ),
        *(
            KernelBuild(
                "fit-ballstick",
                "ballstick.cu",
                name,
                ("philox.cuh",),
                ballstick.kernel_defines(bs, n_measurements, name == "ballstick_mcmc"),
            )
            for name in ("ballstick_lm", "ballstick_mcmc")
        ),
    ]
    commit_defines = commit_device.kernel_defines(n_measurements, 1, commit.N_ORIENTATIONS)
    builds += [KernelBuild("commit", "commit.cu", name, (), commit_defines) for name in commit_device.KERNEL_NAMES]
    return tuple(builds)


def compile_all(
    progress: Callable[[int, int, str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    *,
    builds: tuple[KernelBuild, ...] | None = None,
    compile: Callable[[KernelBuild], object] | None = None,
) -> list[CompiledBuild]:
    """Compile every build of :func:`catalogue` (or ``builds``), in order.

    ``progress(done, total, label)`` comes after each build; ``cancelled()`` is checked
    before each, and a true answer stops early (what was compiled stays compiled and cached).
    ``compile`` replaces :meth:`KernelBuild.compile` (tests, without a GPU).
    Returns what was compiled and how long each took.
    """
    builds = catalogue() if builds is None else builds
    real = compile is None
    compile = compile or KernelBuild.compile
    done: list[CompiledBuild] = []
    for build in builds:
        if cancelled is not None and cancelled():
            return done
        start = time.perf_counter()
        compile(build)
        done.append(CompiledBuild(build, time.perf_counter() - start))
        if progress is not None:
            progress(len(done), len(builds), build.label)
    if real:
        cuda.mark_warmed()
    return done
