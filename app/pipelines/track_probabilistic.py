"""Use case: probabilistic tracking (probtrackx style) in passes, yielding the running path
distribution after each: a coarse first pass, then larger passes that refine it up to the run's
samples per seed voxel.

One function, :func:`track_probabilistic`, serves the Probabilistic panel (Track, and the live
mode that re-tracks at every ROI stroke), ``tractlens track probabilistic`` and Python. Given
the inputs as the window holds them (:class:`ProbInputs`: the posterior samples, a snapshot of
the ROIs, the parameters) it brings the ROIs onto the samples' grid in their roles
(:mod:`app.regions`), checks them (:func:`~app.pipelines.probabilistic.prepare_from_regions`,
whose :class:`~app.errors.InputError` is the message to show) and tracks; given a prepared
:class:`~app.pipelines.probabilistic.ProbabilisticRun` (the command line's, from files) it
tracks that.

Why passes are cheap and exact: the engine runs sample k of every seed voxel before sample
k + 1, with one random stream per streamline (:mod:`gpu.probabilistic`), so each running total
is an even sample of the whole seed region, and the totals after the last pass are the same
numbers as one uninterrupted run, whatever the pass sizes. The first pass holds
:data:`FIRST_PASS_GPU` streamlines on a GPU (a map in some milliseconds) and
:data:`FIRST_PASS_CPU` on the CPU, or, once the rate of an earlier run here is known, what the
CPU tracks in about :data:`FIRST_PASS_S` (the compiled loop tracks thousands of HCP
streamlines a second per core, the NumPy reference some tens: a coarser first look in about the
same time); the later passes about a tenth of the run each, within what the engine takes in one
batch (:func:`~app.pipelines.probabilistic.max_batch_streamlines`).

Cancellation (``cancelled()``, polled between passes) ends the generator with
:class:`gpu.backend.Cancelled` after the totals already computed were yielded; the live mode
cancels a stale run this way when a newer stroke arrives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tractlens.gpu.backend import Cancelled, get_backend
from tractlens.gpu.engines import decide_device
from tractlens.gpu.probabilistic import ProbParams, ProbResult, SampleField

from ..errors import InputError
from ..io import BedpostSamples
from ..regions import Regions, RoiCopy, regions_on_grid
from .probabilistic import ProbabilisticRun, max_batch_streamlines, prepare_from_regions

__all__ = [
    "FIRST_PASS_CPU",
    "FIRST_PASS_GPU",
    "MAX_FIRST_PASS_CPU",
    "ProbInputs",
    "ProbUpdate",
    "pass_sizes",
    "track_probabilistic",
]

#: Streamlines in the first, coarse pass on a GPU (tens of thousands: a readable map at once).
FIRST_PASS_GPU = 20_000
#: … and on the CPU while the rate here is unknown: a coarser first look.
FIRST_PASS_CPU = 1_000
#: The later passes each hold about this share of the run (a tenth), never fewer streamlines
#: than the first pass.
UPDATES = 10
#: On the CPU, when the rate of an earlier run is known, the first pass holds what it tracks in
#: about this long (at least :data:`MIN_FIRST_PASS`, at most :data:`MAX_FIRST_PASS_CPU`): a long,
#: winding field tracks far fewer streamlines a second than a small phantom, and the compiled
#: loop on a laptop's cores tracks hundreds of times more than the NumPy reference.
FIRST_PASS_S = 0.1
MIN_FIRST_PASS = 64
MAX_FIRST_PASS_CPU = FIRST_PASS_GPU


@dataclass
class ProbInputs:
    """Probabilistic tracking's inputs as a window holds them: the posterior ``samples``, a
    snapshot of the ROI layers (``rois``, or :class:`~app.regions.Regions` already on the
    samples' grid), the parameters, and optionally the engine's field of the samples
    (``field_``, the large part, kept by the caller between runs) and that field already on
    the GPU (``device_field``: a function of the device giving it, or None)."""

    samples: BedpostSamples
    rois: list[RoiCopy] | Regions
    params: ProbParams
    field_: SampleField | None = None
    device_field: Callable[[str], tuple] | None = None

    def prepare(self) -> ProbabilisticRun:
        """The ROIs in their roles on the samples' grid, checked: the engine's run."""
        grid = (self.samples.affine, tuple(self.samples.mask.shape))
        regions = self.rois if isinstance(self.rois, Regions) else regions_on_grid(self.rois, "probabilistic", grid)
        return prepare_from_regions(self.samples, regions, params=self.params, field_=self.field_)


@dataclass
class ProbUpdate:
    """One running total of a run: the run (seeds, targets, notes), its totals so far, the
    streamlines it will track in all and the pass (0: the coarse first one)."""

    run: ProbabilisticRun
    result: ProbResult
    total: int
    pass_number: int

    @property
    def final(self) -> bool:
        """Every streamline of the run is counted (the converged distribution)."""
        return self.result.streamlines >= self.total


def pass_sizes(
    total: int, n_voxels: int, device: str = "auto", *, first_pass: int | None = None, rate: float | None = None
) -> tuple[int, int]:
    """(first pass, later passes) in streamlines for a run of ``total`` streamlines over a grid
    of ``n_voxels``: the first :data:`FIRST_PASS_GPU` or :data:`FIRST_PASS_CPU` (or
    ``first_pass``), the later ones about ``total / UPDATES`` but no smaller than the first, both
    within what the engine takes in one batch on ``device``
    (:func:`~app.pipelines.probabilistic.max_batch_streamlines`). ``rate``: streamlines a second of
    an earlier run on this device (the CPU's first pass is then sized to :data:`FIRST_PASS_S`).
    ``first_pass=0``: no coarse pass,
    every pass as large as the engine takes (a run nobody watches fill in)."""
    gpu = get_backend(device).is_gpu
    cap = max_batch_streamlines(n_voxels, device)
    if first_pass == 0:  # no coarse look wanted (a scripted run): the engine's largest batches
        return max(1, min(cap, total)), max(1, min(cap, total))
    first = first_pass if first_pass is not None else (FIRST_PASS_GPU if gpu else FIRST_PASS_CPU)
    if first_pass is None and not gpu and rate:
        first = int(min(MAX_FIRST_PASS_CPU, max(MIN_FIRST_PASS, rate * FIRST_PASS_S)))
    first = max(1, min(cap, total, first))
    later = max(1, min(cap, max(first, math.ceil(total / UPDATES))))
    return first, later


def track_probabilistic(
    inputs: ProbInputs | ProbabilisticRun,
    *,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    first_pass: int | None = None,
    later_pass: int | None = None,
    interval_s: float = 0.0,
    gpus: int = 1,
    rate: float | None = None,
) -> Iterator[ProbUpdate]:
    """Track, yielding a :class:`ProbUpdate` after the first pass, after later passes at most
    every ``interval_s`` seconds, and always after the last (``final``).

    ``first_pass`` / ``later_pass``: streamlines per pass (:func:`pass_sizes` when None; 0:
    the engine's own batches, as the command line tracks); ``rate``: streamlines a second of an
    earlier run here (sizes the CPU's first pass).
    ``gpus`` > 1 shares the run out over that many GPUs (one update, the final one).
    ``progress(done, total)`` comes with every pass; ``cancelled()`` is polled between passes.
    Raises :class:`~app.errors.InputError` for inputs that cannot be tracked (no seed on the
    grid, an empty seed, too many targets…), before anything is tracked.

    The use case of the window's Probabilistic panel; ``tractlens track probabilistic`` runs the
    same engine in one pass (``first_pass=0``).

    Parameters
    ----------
    inputs : ProbInputs or ProbabilisticRun
        The posterior samples of a bedpostX folder (:func:`tractlens.app.io.load_bedpostx`),
        the ROIs by role (seed, targets, waypoints, exclusion, stop) and the
        :class:`~tractlens.gpu.probabilistic_params.ProbParams` (samples per seed voxel, step in
        mm, curvature threshold, …, probtrackx2's defaults); or a run already prepared.
    device : {"auto", "cpu", "gpu"}
        Where to track.
    progress, cancelled : callable, optional
        ``progress(done, total)`` after each pass and a cancellation check between passes.
    first_pass, later_pass : int, optional
        Streamlines per pass; 0 tracks in the engine's own batches.
    interval_s : float
        Least time (s) between two updates after the first.
    gpus : int
        GPUs to share the run over.
    rate : float, optional
        Streamlines per second of an earlier run here (sizes the CPU's first pass).

    Yields
    ------
    ProbUpdate
        ``result`` (:class:`~tractlens.gpu.probabilistic_params.ProbResult`: ``paths``, the path
        distribution, ``waytotal``, ``seed_targets``, ``streamlines``), ``total`` and ``final``.
        Streamlines run as "sample k of every seed voxel, then k + 1", so each update is an
        evenly filled distribution.

    References
    ----------
    .. [1] Behrens TEJ, Berg HJ, Jbabdi S, Rushworth MFS, Woolrich MW. Probabilistic diffusion
       tractography with multiple fibre orientations: what can we gain? NeuroImage 34:144-155
       (2007).
    .. [2] Hernandez M et al. Accelerating fibre orientation estimation from diffusion weighted
       magnetic resonance imaging using GPUs. PLoS One 8:e61892 (2013).

    Examples
    --------
    Posterior samples of one fibre along x in a 12 × 5 × 5 block of 2 mm voxels, a seed voxel at
    one end and a target plane at the other:

    >>> import numpy as np
    >>> from tractlens.app.io.bedpostx import BedpostSamples
    >>> from tractlens.app.pipelines.track_probabilistic import ProbInputs, track_probabilistic
    >>> from tractlens.app.regions import RoiCopy
    >>> from tractlens.gpu.probabilistic_params import ProbParams
    >>> shape = (12, 5, 5, 1, 8)  # X, Y, Z, fibres, posterior samples
    >>> theta = np.full(shape, np.pi / 2, np.float32)  # θ = 90°, φ = 0: along x
    >>> phi, f = np.zeros(shape, np.float32), np.full(shape, 0.8, np.float32)
    >>> affine = np.diag([2.0, 2.0, 2.0, 1.0])
    >>> samples = BedpostSamples(theta, phi, f, np.ones(shape[:3], bool), affine)
    >>> seed = np.zeros(shape[:3], bool)
    >>> seed[2, 2, 2] = True
    >>> target = np.zeros(shape[:3], bool)
    >>> target[9] = True
    >>> rois = [RoiCopy("seed", "seed", seed, affine), RoiCopy("target", "target", target, affine)]
    >>> inputs = ProbInputs(samples, rois, ProbParams(n_samples=100))
    >>> *_, last = track_probabilistic(inputs, device="cpu", first_pass=0)
    >>> last.final, last.result.waytotal, last.result.seed_targets.tolist()
    (True, 100, [[100]])
    >>> last.result.paths[:, 2, 2].tolist()  # every streamline runs the length of the fibre
    [100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100]
    """
    run = inputs.prepare() if isinstance(inputs, ProbInputs) else inputs
    total = len(run.seeds) * run.params.n_samples
    if gpus < 1:
        raise InputError(f"--gpus must be at least 1, got {gpus}", fix="Give how many GPUs to use, e.g. --gpus 2")
    if gpus > 1:
        yield ProbUpdate(run, run.track_on_gpus(gpus, progress=progress, cancelled=cancelled), total, 0)
        return
    # The device once, as the run will choose it (a small run may go to the CPU): passes sized for it.
    chosen = decide_device("probabilistic", total * run.params.n_steps, requested=device).argument
    first, later = pass_sizes(total, int(np.prod(run.samples.mask.shape)), chosen, first_pass=first_pass, rate=rate)
    later = later_pass or later
    device_field = None
    if isinstance(inputs, ProbInputs) and inputs.device_field is not None and get_backend(chosen).is_gpu:
        device_field = inputs.device_field(chosen)
    number, last_shown, pending = 0, 0.0, None
    passes = run.run(
        device=device,
        progress=progress,
        cancelled=cancelled,
        batch_streamlines=max(first, later),
        first_batch=first,
        device_field=device_field,
    )
    try:
        for result in passes:
            update = ProbUpdate(run, result, total, number)
            number += 1
            now = time.perf_counter()
            if update.pass_number == 0 or update.final or now - last_shown >= interval_s:
                last_shown, pending = now, None
                yield update
            else:
                pending = update
    except Cancelled:
        if pending is not None:  # cancelled after a pass not shown yet: hand out its totals first
            yield pending
        raise
