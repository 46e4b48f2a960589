"""How long a long job will take on the CPU, said before it starts.

Ball & sticks, probabilistic tracking and COMMIT take seconds on a GPU but can take hours with
the NumPy engine. The window announces such a job with its estimate (and asks first when
someone can be asked); the command line logs it. The rates are the NumPy engines' measured on
one core (``tests/benchmarks``: ``bench_ballstick.py``, ``bench_probabilistic.py``,
``bench_cpu_peers.py``), and probabilistic tracking's compiled loop's per thread
(``bench_probabilistic_cpu.py``); an estimate is an order of magnitude, not a promise.

* ball & sticks: :data:`BALLSTICK_CPU_VOXELS_PER_S` voxels a second at FSL's 1250 + 1000
  iterations, by number of measurements, scaled by the iterations asked for;
* probabilistic tracking: :data:`PROBABILISTIC_CPU_STEPS_PER_S` steps a second with NumPy,
  :data:`PROBABILISTIC_COMPILED_STEPS_PER_S` per thread with the compiled loop; a streamline
  takes at most ``n_steps`` steps and about :data:`PATH_FRACTION` of the grid's diagonal
  (whole-brain runs averaged 491-503 steps of 0.5 mm in a 145×174×145 grid of 1.25 mm);
* COMMIT: :data:`COMMIT_CPU_S_PER_SEGMENT_ITERATION` seconds per segment (≈ point) and
  iteration, with :data:`COMMIT_TYPICAL_ITERATIONS` iterations (98 to tolerance 1e-3 measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tractlens.gpu.engines import decide_device

#: Ball & sticks, NumPy engine, FSL's defaults, one core: voxels per second by measurements.
BALLSTICK_CPU_VOXELS_PER_S = {60: 10.8, 288: 4.0}
BALLSTICK_REFERENCE_ITERATIONS = 2250  # burn-in 1000 + 1250 jumps, at which the rates were measured
#: Probabilistic tracking, NumPy engine: 2000 streamlines × 502.9 steps in 40.1 s.
PROBABILISTIC_CPU_STEPS_PER_S = 25_000.0
#: … and the compiled loop (numba), per thread: 20,000 streamlines × 498 steps in 4.36 s of CPU
#: time on one thread (results/probabilistic_cpu.json, a shared 2-core machine).
PROBABILISTIC_COMPILED_STEPS_PER_S = 2.3e6
PATH_FRACTION = 0.75  # mean steps ≈ this share of the grid's diagonal (491 of 672 steps measured)
#: COMMIT, NumPy engine: 3.24 s for 414 038 segments × 98 iterations.
COMMIT_CPU_S_PER_SEGMENT_ITERATION = 8.0e-8
COMMIT_TYPICAL_ITERATIONS = 100
#: A CPU job expected to take longer than this is announced before it starts.
ANNOUNCE_S = 120.0


@dataclass(frozen=True)
class JobEstimate:
    """What a job will cost: the device it will run on and, on the CPU, the expected seconds."""

    what: str  # "ball & sticks in 41 000 voxels"
    device: str  # "cpu" or "gpu"
    seconds: float | None  # None on the GPU (seconds: not worth announcing)

    @property
    def long(self) -> bool:
        """Worth announcing before it starts: on the CPU and above :data:`ANNOUNCE_S`."""
        return self.device == "cpu" and self.seconds is not None and self.seconds > ANNOUNCE_S

    @property
    def text(self) -> str:
        """``"about 0.8 h on the CPU"``, or ``""`` on the GPU."""
        if self.device != "cpu" or self.seconds is None:
            return ""
        return f"about {format_duration(self.seconds)} on the CPU"

    def announcement(self) -> str:
        """The sentence the window shows before a long job starts."""
        return (
            f"{self.what[:1].upper()}{self.what[1:]} will take {self.text} (no GPU is used); a GPU takes "
            "seconds. It can be cancelled at any time (Jobs ▸ Cancel all jobs)."
        )


def format_duration(seconds: float) -> str:
    """A duration as people say it: ``"40 s"``, ``"12 min"``, ``"0.8 h"``, ``"3.1 h"``."""
    seconds = float(seconds)
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 45 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _device(method: str, work: float, device: str) -> str:
    return decide_device(method, work, requested=device).device


def ballstick_estimate(n_voxels: int, n_volumes: int, burnin: int, njumps: int, device: str = "auto") -> JobEstimate:
    """Ball & sticks in ``n_voxels`` voxels of a ``n_volumes`` series with ``burnin + njumps`` iterations."""
    iterations = burnin + njumps
    rates = BALLSTICK_CPU_VOXELS_PER_S
    rate = float(np.interp(n_volumes, list(rates), list(rates.values())))
    seconds = n_voxels / rate * iterations / BALLSTICK_REFERENCE_ITERATIONS
    chosen = _device("fit-ballstick", n_voxels * n_volumes * iterations, device)
    return JobEstimate(f"ball & sticks in {n_voxels} voxels", chosen, seconds if chosen == "cpu" else None)


def probabilistic_estimate(
    n_streamlines: int, n_steps: int, step_mm: float, grid_diagonal_mm: float, device: str = "auto"
) -> JobEstimate:
    """Probabilistic tracking of ``n_streamlines`` (seed voxels × samples) of at most ``n_steps``
    steps of ``step_mm`` in a grid whose diagonal is ``grid_diagonal_mm``."""
    steps = min(float(n_steps), PATH_FRACTION * grid_diagonal_mm / max(step_mm, 1e-6))
    seconds = n_streamlines * max(steps, 1.0) / probabilistic_cpu_steps_per_s()
    chosen = _device("probabilistic", n_streamlines * n_steps, device)
    return JobEstimate(
        f"probabilistic tracking of {n_streamlines} streamlines", chosen, seconds if chosen == "cpu" else None
    )


def probabilistic_cpu_steps_per_s() -> float:
    """Steps a second of probabilistic tracking on this CPU: the compiled loop's rate per thread
    times the CPU engines' threads when numba is installed, else the NumPy reference's."""
    from tractlens.gpu import probabilistic_host
    from tractlens.gpu.host import host_threads

    if probabilistic_host.available():
        return PROBABILISTIC_COMPILED_STEPS_PER_S * host_threads()
    return PROBABILISTIC_CPU_STEPS_PER_S


def commit_estimate(n_segments: int, max_iter: int, device: str = "auto") -> JobEstimate:
    """COMMIT of a tractogram of ``n_segments`` segments (≈ points), at most ``max_iter`` iterations."""
    iterations = min(max_iter, COMMIT_TYPICAL_ITERATIONS)
    seconds = n_segments * iterations * COMMIT_CPU_S_PER_SEGMENT_ITERATION
    chosen = _device("commit", n_segments * max_iter, device)
    return JobEstimate(f"COMMIT of {n_segments} segments", chosen, seconds if chosen == "cpu" else None)


def grid_diagonal_mm(affine: np.ndarray, shape) -> float:
    """The length of a grid's diagonal in mm."""
    zooms = np.linalg.norm(np.asarray(affine, dtype=np.float64)[:3, :3], axis=0)
    return float(np.linalg.norm(np.asarray(shape[:3], dtype=np.float64) * zooms))
