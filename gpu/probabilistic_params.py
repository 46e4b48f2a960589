"""What probabilistic tracking (:mod:`gpu.probabilistic`) takes and gives: its parameters
(:class:`ProbParams`), the posterior samples it draws from (:class:`SampleField`), the masks as
one volume of bits (:func:`mask_bits`), the totals of a run (:class:`ProbResult`), the order in
which a run visits its streamlines (:func:`streamline_ids`) and the bits, random-stream purposes
and batch sizes that the NumPy reference and the CUDA kernel share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .params import meta

BIT_BRAIN, BIT_EXCLUDE, BIT_STOP = 1, 2, 4
WAYPOINT_SHIFT, MAX_WAYPOINTS = 3, 8
TARGET_SHIFT, MAX_TARGETS = 11, 21

# Stream purposes (Philox counter word 1, with the half in bit 8).
P_STEP, P_START, P_EULER, P_RANDFIB = 0, 1, 2, 3


STOP_REASONS = ("steps", "mask", "curvature", "stop mask", "loop", "excluded")


@dataclass(frozen=True)
class ProbParams:
    """probtrackx's options (same defaults)."""

    n_samples: int = field(default=5000, metadata=meta("Samples", "streamlines per seed voxel", "", (1, 10**7)))
    step_mm: float = field(default=0.5, metadata=meta("Step", "step length", "mm", (0.01, 10.0)))
    n_steps: int = field(default=2000, metadata=meta("Max steps", "max steps per half streamline", "", (1, 10**5)))
    cthr: float = field(
        default=0.2,
        metadata=meta(
            "Max angle",
            "stop where one step turns more than this angle, kept as its cosine like probtrackx's "
            "curvature threshold (0.2 = 78°, 0.7 = 45°); 90° or more (a cosine of 0 or less) never stops",
            "cosine",
            (-1.0, 1.0),
        ),
    )
    fibthresh: float = field(
        default=0.01,
        metadata=meta("Stick threshold", "sticks with a smaller volume fraction are not followed", "", (0.0, 1.0)),
    )
    randfib: int = field(
        default=0,
        metadata=meta(
            "First stick",
            "0 stick 1, 1 uniform, 2 by fraction (above the threshold)",
            "",
            (0, 2),
            choices=(0, 1, 2),
        ),
    )
    loopcheck: bool = field(default=False, metadata=meta("Loop check", "stop a half that re-enters a voxel it left"))
    modeuler: bool = field(
        default=False,
        metadata=meta("Modified Euler", "average the direction over the step"),
    )
    waycond: str = field(
        default="AND",
        metadata=meta(
            "Waypoints",
            "AND: all waypoint masks, OR: any",
            choices=("AND", "OR"),
        ),
    )
    seed: int = field(
        default=0,
        metadata=meta("Random seed", "the same seed gives the same result", "", (0, 2**31 - 1)),
    )

    def __post_init__(self):
        if self.n_samples < 1 or self.n_steps < 1:
            raise ValueError("n_samples and n_steps must be at least 1")
        if not self.step_mm > 0:
            raise ValueError("step_mm must be positive")
        if not -1.0 <= self.cthr <= 1.0:
            raise ValueError("cthr is a cosine: give a value in [-1, 1]")
        if self.randfib not in (0, 1, 2):
            raise ValueError("randfib must be 0, 1 or 2")
        if self.waycond not in ("AND", "OR"):
            raise ValueError("waycond must be AND or OR")
        if not 0 <= self.seed < 2**63:
            raise ValueError("seed must be a non-negative 63-bit integer")


@dataclass
class SampleField:
    """Posterior samples on a grid, ready for tracking.

    dirs : (n_voxels, S, L, 3) float32 unit stick directions in voxel axes (physical
        directions: scaled by the voxel size they give voxel steps).
    f : (n_voxels, S, L) float32 fractions.
    index : (X, Y, Z) int32, the row of each grid voxel in ``dirs``, −1 without samples.
    voxel_size : (3,) mm.
    """

    dirs: np.ndarray
    f: np.ndarray
    index: np.ndarray
    voxel_size: np.ndarray

    @classmethod
    def from_grid(cls, dirs: np.ndarray, f: np.ndarray, mask: np.ndarray, voxel_size) -> SampleField:
        """From (X, Y, Z, L, S, 3) directions and (X, Y, Z, L, S) fractions inside ``mask``."""
        mask = np.asarray(mask, dtype=bool)
        index = np.full(mask.shape, -1, dtype=np.int32)
        index[mask] = np.arange(int(mask.sum()), dtype=np.int32)
        d = np.ascontiguousarray(np.moveaxis(dirs[mask], 2, 1), dtype=np.float32)  # (n, S, L, 3)
        ff = np.ascontiguousarray(np.moveaxis(f[mask], 2, 1), dtype=np.float32)  # (n, S, L)
        return cls(d, ff, index, np.asarray(voxel_size, dtype=np.float64))

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.index.shape)

    @property
    def n_samples(self) -> int:
        return int(self.dirs.shape[1])

    @property
    def n_fibres(self) -> int:
        return int(self.dirs.shape[2])


def mask_bits(brain, exclude=None, stop=None, waypoints=(), targets=()) -> np.ndarray:
    """The uint32 mask volume the engine reads: brain, exclusion, stop, waypoint i, target j bits."""
    brain = np.asarray(brain, dtype=bool)
    if len(waypoints) > MAX_WAYPOINTS or len(targets) > MAX_TARGETS:
        raise ValueError(f"at most {MAX_WAYPOINTS} waypoint and {MAX_TARGETS} target masks")
    bits = brain.astype(np.uint32) * BIT_BRAIN
    for mask, bit in ((exclude, BIT_EXCLUDE), (stop, BIT_STOP)):
        if mask is not None:
            bits |= np.asarray(mask, dtype=bool).astype(np.uint32) * np.uint32(bit)
    for i, mask in enumerate(waypoints):
        bits |= np.asarray(mask, dtype=bool).astype(np.uint32) << np.uint32(WAYPOINT_SHIFT + i)
    for j, mask in enumerate(targets):
        bits |= np.asarray(mask, dtype=bool).astype(np.uint32) << np.uint32(TARGET_SHIFT + j)
    return bits


@dataclass
class ProbResult:
    """What a run adds up (host arrays).

    paths : (X, Y, Z) int64 path distribution (kept streamlines visiting each voxel).
    waytotal : kept streamlines.
    seed_targets : (n_seed_voxels, n_targets) int64 kept streamlines of each seed voxel reaching each target.
    streamlines : streamlines tracked (kept or not).
    steps : steps taken by all of them (both halves), a measure of their length.
    seed_matrix : (n_seed_voxels, n_seed_voxels) int64 or None: kept streamlines of seed voxel a
        visiting seed voxel b (probtrackx's matrix1; the diagonal counts each seed voxel's own
        kept streamlines, which all start in it).
    """

    paths: np.ndarray
    waytotal: int
    seed_targets: np.ndarray
    streamlines: int
    provenance: dict = field(default_factory=dict)
    steps: int = 0
    seed_matrix: np.ndarray | None = None


#: Seed voxels at most for the seed × seed matrix (n² counts on the device: 1 GiB).
MAX_SEED_MATRIX = 16384


def check_seed_matrix(n_seeds: int) -> None:
    if n_seeds > MAX_SEED_MATRIX:
        raise ValueError(
            f"a seed x seed matrix of {n_seeds} seed voxels is too large (at most {MAX_SEED_MATRIX}); "
            "use a smaller or coarser seed mask, or target masks"
        )


def empty_seed_matrix(n_seeds: int) -> np.ndarray:
    """The seed x seed counts a host engine adds to: (n_seeds, n_seeds) int64 zeros, after
    :func:`check_seed_matrix`."""
    check_seed_matrix(n_seeds)
    return np.zeros((n_seeds, n_seeds), dtype=np.int64)


def run_length(first: int, count: int | None, positions, n_seeds: int, n_samples: int) -> int:
    """Streamlines a call tracks: ``len(positions)``, else ``count``, else the run's from ``first``
    to its end (``n_seeds * n_samples`` in all)."""
    if positions is not None:
        return len(positions)
    return n_seeds * n_samples - first if count is None else count


def streamline_ids(first: int, count: int, n_seeds: int, n_samples: int, positions=None):
    """(streamline ids, seed voxel numbers) of run positions ``first .. first + count`` (or of
    the run positions ``positions``)."""
    j = np.arange(first, first + count, dtype=np.int64) if positions is None else np.asarray(positions, np.int64)
    seed_of = j % n_seeds
    return (seed_of * n_samples + j // n_seeds).astype(np.uint64), seed_of


def bitmap_voxels(bits, n_seeds: int) -> int:
    """Columns of the NumPy reference's visit bitmap (:func:`gpu.probabilistic_numpy.track_numpy`),
    about: the brain's voxels (a step enters no other) and the seed voxels."""
    return max(1, int(np.count_nonzero(np.asarray(bits) & np.uint32(BIT_BRAIN))) + int(n_seeds))


#: Streamlines per NumPy batch that its bitmap of brain voxels may grow a batch to (beyond what a
#: bitmap of the whole grid allowed; an HCP grid's 73 become ~245): a batch steps until its longest
#: streamline ends, so larger batches carry ever more ended rows (on a 2.5 mm phantom, batches of
#: 600 and 2,400 ran alike, of 300 twice and of 75 four times as long).
NUMPY_BATCH_GROWTH = 512


def numpy_batch(bits, n_seeds: int) -> int:
    """Streamlines per batch of the NumPy reference: as many as a visit bitmap of
    :data:`NUMPY_BITMAP_BYTES` holds (:func:`bitmap_voxels` columns), never fewer than a bitmap of
    the whole grid would hold, and more than that only up to :data:`NUMPY_BATCH_GROWTH`."""
    whole = NUMPY_BITMAP_BYTES // max(1, int(np.size(bits)))
    return max(1, min(NUMPY_BITMAP_BYTES // bitmap_voxels(bits, n_seeds), max(whole, NUMPY_BATCH_GROWTH)))


#: Streamlines per batch: the GPU's (running totals about every 0.8 s on an H100: each
#: batch ends waiting for its longest streamline, so batches are not made smaller than
#: a viewer needs) and the bytes of the NumPy reference's dense visit bitmap.
GPU_BATCH = 8_000_000
NUMPY_BITMAP_BYTES = 256 * 2**20
