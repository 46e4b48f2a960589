"""Probabilistic tractography from ball & sticks posterior samples, probtrackx style
(Behrens et al. 2007, probtrackx; Hernández et al. 2013, on the GPU).

Every seed voxel sends ``n_samples`` streamlines from uniform random points in it.
Each streamline is tracked in two halves from its start point, the second starting
against the first's initial direction; a step:

1. takes the voxel to sample from: per axis, the upper neighbour of the position
   with probability equal to the position's fractional part (trilinear weights);
2. takes one posterior sample of that voxel uniformly, and in it the stick best
   aligned with the previous direction among those with f > ``fibthresh`` (stick 1
   when none is); on a half's first step without a previous direction the stick is
   given by ``randfib``: 0 stick 1, 1 uniform among f > fibthresh, 2 proportional to f;
3. flips the stick to agree with the previous direction and stops the half when the
   cosine between them is below ``cthr``;
4. moves ``step_mm`` along it (``modeuler``: along the mean of it and the direction
   sampled the same way at the Euler end point).

A half stops when it leaves the grid or the brain mask, after ``n_steps`` steps, on
a sharp turn, on entering a stop voxel (which is counted), or — with ``loopcheck`` —
on re-entering a voxel it has left. Entering an exclusion voxel discards the whole
streamline. A kept streamline (``waycond`` AND: it met every waypoint mask, OR: at
least one; all kept without waypoints) adds one to every voxel it visited (once per
streamline, however often it passes) in the path distribution, and one per target
mask reached to its seed voxel's row of the seed × target counts.

FSL's loop check compares directions on a coarse grid; ours stops a half that
re-enters a voxel of the streamline it has already left, which uses the set of
visited voxels the counting keeps anyway.

Masks reach the engine as one uint32 volume of bits (:func:`mask_bits`).
Random numbers: Philox4x32-10 (as :mod:`gpu.ballstick`), one stream per
streamline (counter: draw, purpose and half, streamline id); the streamline id is
``seed voxel number × n_samples + k`` for sample k, so results do not depend on
batching. Streamlines are run in the order j = k × n_seeds + seed voxel number
(sample k of every seed voxel before sample k + 1; :func:`streamline_ids`), so a
batch — a range of j — spreads over all the seed voxels and the path distribution
fills in evenly while a run goes on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from .backend import Cancelled, OutOfDeviceMemory, get_backend
from .ballstick import _seed_key, philox4x32
from .engines import KERNEL, NUMPY, choose_engine
from .params import meta

BIT_BRAIN, BIT_EXCLUDE, BIT_STOP = 1, 2, 4
WAYPOINT_SHIFT, MAX_WAYPOINTS = 3, 8
TARGET_SHIFT, MAX_TARGETS = 11, 21

# Stream purposes (Philox counter word 1, with the half in bit 8).
P_STEP, P_START, P_EULER, P_RANDFIB = 0, 1, 2, 3


def kernel_defines(seed_matrix: bool = False, visit_list: bool = False) -> tuple[tuple[str, int], ...]:
    """What kernels/probabilistic.cu receives at compile time: the mask bits, the stream
    purposes, whether the seed × seed matrix is counted (it costs registers) and whether
    kept streamlines list their voxels (the connectome modes, :mod:`gpu.connectome`)."""
    return (
        ("BIT_BRAIN", BIT_BRAIN),
        ("BIT_EXCLUDE", BIT_EXCLUDE),
        ("BIT_STOP", BIT_STOP),
        ("TARGET_SHIFT", TARGET_SHIFT),
        ("P_STEP", P_STEP),
        ("P_START", P_START),
        ("P_EULER", P_EULER),
        ("P_RANDFIB", P_RANDFIB),
        ("SEED_MATRIX", int(seed_matrix)),
        ("VISIT_LIST", int(visit_list)),
    )


def kernel_function(seed_matrix: bool = False, visit_list: bool = False):
    """The compiled ``prob_track`` kernel."""
    from . import cuda

    return cuda.function("probabilistic.cu", "prob_track", ("philox.cuh",), kernel_defines(seed_matrix, visit_list))


STOP_REASONS = ("steps", "mask", "curvature", "stop mask", "loop", "excluded")


@dataclass(frozen=True)
class ProbParams:
    """probtrackx's options (same defaults)."""

    n_samples: int = field(
        default=5000, metadata=meta("Samples", "streamlines per seed voxel", "", (1, 10**7), flags=("--nsamples",))
    )
    step_mm: float = field(
        default=0.5, metadata=meta("Step", "step length", "mm", (0.01, 10.0), flags=("--steplength",))
    )
    n_steps: int = field(
        default=2000, metadata=meta("Max steps", "max steps per half streamline", "", (1, 10**5), flags=("--nsteps",))
    )
    cthr: float = field(
        default=0.2,
        metadata=meta(
            "Max turn (cosine)",
            "stop where the cosine of a turn falls below this: 0.2 allows turns up to 78°, 0.7 up to 45°",
            "",
            (-1.0, 1.0),
            cli_help="curvature threshold, a cosine",
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
            cli_help="first step's stick",
        ),
    )
    loopcheck: bool = field(default=False, metadata=meta("Loop check", "stop a half that re-enters a voxel it left"))
    modeuler: bool = field(
        default=False,
        metadata=meta("Modified Euler", "average the direction over the step", cli_help="modified Euler integration"),
    )
    waycond: str = field(
        default="AND",
        metadata=meta(
            "Waypoints",
            "AND: all waypoint masks, OR: any",
            choices=("AND", "OR"),
            cli_help="pass all waypoints or any",
        ),
    )
    seed: int = field(
        default=0,
        metadata=meta(
            "Random seed", "the same seed gives the same result", "", (0, 2**31 - 1), flags=("--seed-rng",), metavar="N"
        ),
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


def _uniform(x):
    return (x.astype(np.float64) + 0.5) * 2.0**-32


def _draw(purpose: int, half: int, draw, sid: np.ndarray, key):
    s = sid.astype(np.uint64)
    counter = (
        np.asarray(draw, dtype=np.uint64),
        np.uint64(purpose | (half << 8)),
        s & np.uint64(0xFFFFFFFF),
        s >> np.uint64(32),
    )
    return philox4x32(counter, key)


def _sample_direction(field_: SampleField, params: ProbParams, pos, prev, has_prev, draws, fib_draw):
    """Direction (N, 3) drawn at continuous voxel positions ``pos``; zero where none can be drawn."""
    shape = np.array(field_.shape)
    base = np.floor(pos)
    frac = pos - base
    u = np.stack([_uniform(draws[0]), _uniform(draws[1]), _uniform(draws[2])], 1)
    vox = (base + (u < frac)).astype(np.int64)
    inside = ((vox >= 0) & (vox < shape)).all(1)
    centre = np.rint(pos).astype(np.int64)
    vox = np.where(inside[:, None], vox, np.clip(centre, 0, shape - 1))
    row = field_.index[vox[:, 0], vox[:, 1], vox[:, 2]]
    fallback = field_.index[tuple(np.clip(centre, 0, shape - 1).T)]
    row = np.where(row >= 0, row, fallback)
    S, L = field_.n_samples, field_.n_fibres
    s = ((draws[3].astype(np.uint64) * np.uint64(S)) >> np.uint64(32)).astype(np.int64)
    ok = row >= 0
    r = np.where(ok, row, 0)
    d = field_.dirs[r, s].astype(np.float64)  # (N, L, 3)
    f = field_.f[r, s].astype(np.float64)  # (N, L)
    eligible = f > params.fibthresh
    dots = np.abs((d * prev[:, None, :]).sum(-1))
    best = np.where(eligible.any(1), np.argmax(np.where(eligible, dots, -1.0), axis=1), 0)
    if params.randfib == 0:
        first = np.zeros(len(pos), dtype=np.int64)
    else:
        weights = eligible * (1.0 if params.randfib == 1 else f)
        total = weights.sum(1)
        cum = np.cumsum(weights, 1)
        pick = _uniform(fib_draw) * total
        first = np.where(total > 0, np.minimum((cum <= pick[:, None]).sum(1), L - 1), 0)
    choice = np.where(has_prev, best, first)
    out = d[np.arange(len(pos)), choice]
    return np.where(ok[:, None], out, 0.0)


#: Seed voxels at most for the seed × seed matrix (n² counts on the device: 1 GiB).
MAX_SEED_MATRIX = 16384


def check_seed_matrix(n_seeds: int) -> None:
    if n_seeds > MAX_SEED_MATRIX:
        raise ValueError(
            f"a seed x seed matrix of {n_seeds} seed voxels is too large (at most {MAX_SEED_MATRIX}); "
            "use a smaller or coarser seed mask, or target masks"
        )


def streamline_ids(first: int, count: int, n_seeds: int, n_samples: int, positions=None):
    """(streamline ids, seed voxel numbers) of run positions ``first .. first + count`` (or of
    the run positions ``positions``)."""
    j = np.arange(first, first + count, dtype=np.int64) if positions is None else np.asarray(positions, np.int64)
    seed_of = j % n_seeds
    return (seed_of * n_samples + j // n_seeds).astype(np.uint64), seed_of


def track_numpy(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    n_targets: int = 0,
    n_waypoints: int = 0,
    first_id: int = 0,
    count: int | None = None,
    record: bool = False,
    positions: np.ndarray | None = None,
    seed_matrix: bool = False,
):
    """Track the streamlines at run positions ``first_id .. first_id + count`` (default: all
    ``len(seeds) * n_samples``; or the run positions ``positions``; see
    :func:`streamline_ids`; ``seeds`` ijk (n, 3)) with the NumPy reference. Returns :class:`ProbResult` (seed × target rows for
    all of ``seeds``), plus the step sequences (x, y, z, alive per step, per half) when
    ``record``. Visits are kept in a dense (streamlines × voxels) bitmap, so batches must
    be small on large grids (:func:`iter_track` sizes them)."""
    key = _seed_key(params.seed)
    shape = np.array(field_.shape)
    n_vox = int(np.prod(shape))
    n = len(seeds) * params.n_samples - first_id if count is None else count
    n = n if positions is None else len(positions)
    sid, seed_of = streamline_ids(first_id, n, len(seeds), params.n_samples, positions)
    jitter = _draw(P_START, 0, 0, sid, key)
    start = seeds[seed_of] + np.stack([_uniform(jitter[i]) - 0.5 for i in range(3)], 1)
    flat = lambda v: (v[:, 0] * shape[1] + v[:, 1]) * shape[2] + v[:, 2]  # noqa: E731
    visited = np.zeros((n, n_vox), dtype=bool)
    hits = np.zeros(n, dtype=np.uint32)
    excluded = np.zeros(n, dtype=bool)
    first_dir = np.zeros((n, 3))
    first_taken = np.zeros(n, dtype=bool)
    rows = np.arange(n)
    sv = np.rint(start).astype(np.int64)
    in_grid = ((sv >= 0) & (sv < shape)).all(1)
    svc = np.clip(sv, 0, shape - 1)
    visited[rows[in_grid], flat(svc)[in_grid]] = True
    hits |= np.where(in_grid, bits[tuple(svc.T)], 0).astype(np.uint32)
    excluded |= (hits & BIT_EXCLUDE) != 0
    steps_record = []
    moves = 0
    scale = params.step_mm / field_.voxel_size
    for half in (0, 1):
        pos = start.copy()
        prev = -first_dir if half else np.zeros((n, 3))
        has_prev = first_taken.copy() if half else np.zeros(n, dtype=bool)
        alive = in_grid & ((hits & BIT_BRAIN) != 0) & ~excluded
        current = flat(svc)
        trace = [np.concatenate([pos, alive[:, None]], 1)] if record else None
        for step in range(params.n_steps):
            if not alive.any():
                break
            draws = _draw(P_STEP, half, step, sid, key)
            fib = _draw(P_RANDFIB, half, step, sid, key)[0]
            d = _sample_direction(field_, params, pos, prev, has_prev, draws, fib)
            cos = (d * prev).sum(1)
            d = np.where((has_prev & (cos < 0))[:, None], -d, d)
            cos = np.abs(cos)
            zero = ~(np.abs(d).sum(1) > 0)
            turn = has_prev & (cos < params.cthr)
            if params.modeuler:
                mid = pos + d * scale
                draws2 = _draw(P_EULER, half, step, sid, key)
                d2 = _sample_direction(field_, params, mid, d, np.ones(n, bool), draws2, draws2[0])
                d2 = np.where(((d2 * d).sum(1) < 0)[:, None], -d2, d2)
                mean = d + d2
                norm = np.linalg.norm(mean, axis=1)
                d = np.where((norm > 0)[:, None], mean / np.where(norm > 0, norm, 1.0)[:, None], d)
            alive &= ~zero & ~turn
            new = pos + d * scale
            nv = np.rint(new).astype(np.int64)
            inside = ((nv >= 0) & (nv < shape)).all(1)
            nvc = np.clip(nv, 0, shape - 1)
            b = np.where(inside, bits[tuple(nvc.T)], 0).astype(np.uint32)
            alive &= inside & ((b & BIT_BRAIN) != 0)
            moves += int(alive.sum())
            pos = np.where(alive[:, None], new, pos)
            if half == 0:
                first_dir = np.where((alive & ~first_taken)[:, None], d, first_dir)
                first_taken |= alive
            prev = np.where(alive[:, None], d, prev)
            has_prev |= alive
            hits |= np.where(alive, b, 0).astype(np.uint32)
            newly_excluded = alive & ((b & BIT_EXCLUDE) != 0)
            excluded |= newly_excluded
            alive &= ~newly_excluded
            idx = flat(nvc)
            moved = alive & (idx != current)
            seen = visited[rows, idx]
            if params.loopcheck:
                looped = moved & seen
                alive &= ~looped
                moved &= ~looped
            visited[rows[moved], idx[moved]] = True
            current = np.where(moved, idx, current)
            alive &= (b & BIT_STOP) == 0
            if record:
                trace.append(np.concatenate([pos, alive[:, None]], 1))
        if record:
            steps_record.append(np.stack(trace, 1))
    waymask = sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints))
    if n_waypoints == 0:
        kept = ~excluded
    elif params.waycond == "AND":
        kept = ~excluded & ((hits & np.uint32(waymask)) == waymask)
    else:
        kept = ~excluded & ((hits & np.uint32(waymask)) != 0)
    paths = visited[kept].sum(0).reshape(tuple(shape)).astype(np.int64)
    seed_targets = np.zeros((len(seeds), n_targets), dtype=np.int64)
    for j in range(n_targets):
        reached = kept & ((hits >> np.uint32(TARGET_SHIFT + j)) & 1).astype(bool)
        seed_targets[:, j] = np.bincount(seed_of[reached], minlength=len(seeds))
    matrix = None
    if seed_matrix:
        check_seed_matrix(len(seeds))
        matrix = np.zeros((len(seeds), len(seeds)), dtype=np.int64)
        np.add.at(matrix, seed_of[kept], visited[kept][:, flat(seeds)].astype(np.int64))
    result = ProbResult(paths, int(kept.sum()), seed_targets, n, steps=moves, seed_matrix=matrix)
    return (result, steps_record) if record else result


#: Slots of a thread's visited-voxel set in the first pass (8 bytes each, plus 4 for the
#: member list when streamlines are kept only at their end). A streamline with more than
#: 3/4 as many distinct voxels (3072: ~4 m of path at 1.25 mm, near the 4001 that 2 × 2000
#: steps allow) is run again with a set large enough for any streamline. Such reruns are
#: long and run after the rest of their batch, so they are kept rare (with 2048 slots the
#: benchmark field reran ~35 per million streamlines and ran at 11.1 M/s, with 4096 none and
#: 11.6 M/s on an H100).
SET_SLOTS = 4096


def set_sizes(params: ProbParams, slots: int = SET_SLOTS) -> tuple[int, int, int]:
    """(slots, member limit) of the first pass and the slots of the second: every step enters
    at most one new voxel, so a streamline has at most ``2 n_steps + 1`` distinct voxels; the
    second pass holds that many at a load of at most 1/2."""
    most = 2 * params.n_steps + 1
    full = 1 << int(np.ceil(np.log2(2 * most)))
    if full <= slots:
        return full, most, full
    return slots, slots * 3 // 4, full


def _resident_threads(cp, kernel, block: int) -> int:
    """Threads the device runs at once with this kernel (persistent threads: no more are useful)."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    try:
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0)
    except Exception:  # an older CuPy: assume a full SM
        per_sm = props["maxThreadsPerMultiProcessor"] // block
    return max(1, per_sm) * block * props["multiProcessorCount"]


class KernelTracker:
    """The kernel's state on the device for one run: the field, masks and seeds, the running
    totals, and each thread's visited-voxel set, kept between launches.

    :meth:`launch` queues the streamlines at run positions ``first .. first + count`` on the
    current stream without waiting: the first pass, then a second pass over the
    streamlines that outgrew their sets (its count is read on the device). The totals
    accumulate on the device; :meth:`result` reads them, :meth:`snapshot` copies them
    asynchronously (see :func:`iter_track`).
    """

    BLOCK = 128

    def __init__(
        self,
        backend,
        field_: SampleField,
        bits,
        seeds,
        params: ProbParams,
        n_targets: int = 0,
        n_waypoints: int = 0,
        *,
        max_batch: int,
        device_field=None,
        set_slots: int = SET_SLOTS,
        threads: int | None = None,
        seed_matrix: bool = False,
        visit_list: bool = False,
    ):
        cp = self.cp = backend.xp
        self.backend, self.field, self.params = backend, field_, params
        self.n_seeds, self.n_targets = len(seeds), n_targets
        self.kernel = kernel_function(seed_matrix, visit_list)
        self.visit_list, self.visit_buffers = visit_list, None
        try:
            self.arrays = device_field or upload_field(backend, field_)
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
            size = (field_.dirs.nbytes + field_.f.nbytes + field_.index.nbytes) / 2**30
            raise OutOfDeviceMemory(
                f"the posterior samples ({size:.1f} GiB) do not fit in the free memory of {backend.device_name} "
                f"({backend.free_memory_bytes() / 2**30:.1f} GiB)"
            ) from exc
        self.bits = cp.ascontiguousarray(cp.asarray(bits, dtype=cp.uint32))
        self.seeds = cp.ascontiguousarray(cp.asarray(seeds, dtype=cp.int32))  # argwhere gives F order
        self.paths = cp.zeros(int(np.prod(field_.shape)), dtype=cp.uint64)
        self.seed_targets = cp.zeros((self.n_seeds, max(n_targets, 1)), dtype=cp.uint64)
        self.counters = cp.zeros(4, dtype=cp.uint64)  # kept, abandoned in the last launch, in all, steps
        self.rerun_counters = cp.zeros(4, dtype=cp.uint64)  # the second passes' (abandoned: never)
        self.seed_number = self.seed_matrix = None
        if seed_matrix:
            check_seed_matrix(self.n_seeds)
            number = np.full(field_.shape, -1, dtype=np.int32)
            number[tuple(np.asarray(seeds).T)] = np.arange(self.n_seeds, dtype=np.int32)
            self.seed_number = cp.asarray(number)
            self.seed_matrix = cp.zeros((self.n_seeds, self.n_seeds), dtype=cp.uint32)
        self.totals = (self.paths, self.seed_targets, self.counters, self.rerun_counters)
        self.totals += (self.seed_matrix,) if seed_matrix else ()
        self.waymask = sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints))
        # Kept for sure (no waypoints, no exclusion voxel): count visits as they happen. A visit
        # list needs the member lists, which only the counting at the end keeps.
        self.immediate = not visit_list and self.waymask == 0 and not bool((self.bits & BIT_EXCLUDE).any())
        self.slots, self.limit, self.full = set_sizes(params, set_slots)
        budget = backend.free_memory_bytes() // 4  # the sets take at most a quarter of the free memory
        resident = threads or _resident_threads(cp, self.kernel, self.BLOCK)
        whole = -(-max_batch // self.BLOCK) * self.BLOCK
        per_slot = 8 if self.immediate else 12
        self.threads, self.tables, self.lists = self._sets(
            min(resident, whole, budget // (self.slots * per_slot)), self.slots
        )
        # The second pass's sets hold any streamline; few threads (few streamlines need them).
        self.rerun_threads, self.rerun_tables, self.rerun_lists = 0, None, None
        if self.slots < self.full:
            most = min(resident, whole, 8192, budget // 2 // (self.full * per_slot))
            self.rerun_threads, self.rerun_tables, self.rerun_lists = self._sets(most, self.full)
        self.rerun_stamp = 0
        self.overflow_ids = cp.empty(max(1, max_batch), dtype=cp.uint64)
        self.stamp_base = 0
        self.streamlines = 0

    def _whole(self, threads: int) -> int:  # whole blocks: each thread owns a set
        return max(self.BLOCK, int(threads) // self.BLOCK * self.BLOCK)

    def _sets(self, threads: int, slots: int):
        """(threads, tables, member lists) of visited-voxel sets for up to ``threads`` threads;
        fewer (halving) when the device is out of memory."""
        cp, threads = self.cp, self._whole(threads)
        while True:
            try:
                tables = cp.zeros(threads * slots, dtype=cp.uint64)
                lists = None if self.immediate else cp.empty(threads * slots, dtype=cp.int32)
                return threads, tables, lists
            except Exception as exc:
                if not self.backend.is_out_of_memory(exc):
                    raise
                self.backend.free_cached_memory()
                if threads <= self.BLOCK:
                    raise OutOfDeviceMemory(
                        f"{self.backend.device_name} has no memory left for the tracking threads' visited-voxel sets"
                    ) from exc
                threads = self._whole(threads // 2)

    def _args(self, count, n_device, ids, first, cap, limit, stamp_base, rank_from, tables, lists, counters, trace):
        p, cp = self.params, self.cp
        key0, key1 = _seed_key(p.seed)
        null = np.uint64(0)
        return (
            *self.arrays,
            self.bits,
            self.seeds,
            np.int64(count),
            null if n_device is None else n_device,
            null if ids is None else ids,
            np.int64(first),
            np.int32(p.n_samples),
            np.int64(self.n_seeds),
            *(np.int32(v) for v in self.field.shape),
            np.int32(self.field.n_samples),
            np.int32(self.field.n_fibres),
            *(np.int32(v) for v in (p.n_steps, p.randfib, p.loopcheck, p.modeuler, cap, limit)),
            np.uint32(stamp_base),
            *(np.float64(v) for v in (*(p.step_mm / self.field.voxel_size), p.cthr, p.fibthresh)),
            np.uint32(key0),
            np.uint32(key1),
            np.int32(self.n_targets),
            np.uint32(self.waymask),
            np.int32(p.waycond == "AND"),
            np.int32(self.immediate),
            np.int32(rank_from),
            cp.zeros(1, dtype=cp.uint64),
            tables,
            null if lists is None else lists,
            self.paths,
            self.seed_targets,
            counters,
            self.overflow_ids,
            np.int64(len(self.overflow_ids)),
            null if self.seed_number is None else self.seed_number,
            null if self.seed_matrix is None else self.seed_matrix,
            null if trace is None else trace,
            *self._visit_args(),
        )

    def set_visit_buffers(self, sid, voxel, count) -> None:
        """Where a ``visit_list`` tracker's kept streamlines append (id, voxel) pairs: device
        arrays (capacity,) uint64 and int32, and a (1,) uint64 counter the caller zeroes."""
        self.visit_buffers = (sid, voxel, count)

    def _visit_args(self) -> tuple:
        if not self.visit_list:
            return ()
        if self.visit_buffers is None:
            raise ValueError("a visit-list tracker needs set_visit_buffers before a launch")
        sid, voxel, count = self.visit_buffers
        return sid, voxel, count, np.int64(len(sid))

    def launch(self, first: int, count: int, trace=None, ids=None) -> None:
        """Queue run positions ``first .. first + count`` (at most ``max_batch``), or the
        streamlines of ids ``ids`` (a device array of ``count``). ``trace``: a device array
        (count, 2, n_steps + 1, 4) to fill with their steps (one pass)."""
        if count > len(self.overflow_ids):
            raise ValueError("a launch larger than max_batch")
        if self.stamp_base + count >= 2**32 - 1:  # the stamps would wrap: start the sets afresh
            self.tables.fill(0)
            self.stamp_base = 0
        slots, limit = (self.full, 2 * self.params.n_steps + 1) if trace is not None else (self.slots, self.limit)
        tables = self.tables if slots == self.slots else self.cp.zeros(self.threads * slots, dtype=self.cp.uint64)
        lists = self.lists if slots == self.slots or self.immediate else self.cp.empty_like(tables, dtype=np.int32)
        self.counters[1:2].fill(0)
        threads = min(self.threads, self._whole(-(-count // self.BLOCK) * self.BLOCK))
        args = (count, None, ids, first, slots, limit, self.stamp_base, 0, tables, lists, self.counters, trace)
        self.kernel((threads // self.BLOCK,), (self.BLOCK,), self._args(*args))
        self.stamp_base += count
        # The streamlines that outgrew their sets, again with sets for any streamline, adding the
        # voxels from the one where the first pass stopped (counted as they came) or all of them.
        if trace is None and self.rerun_tables is not None:
            if self.rerun_stamp + count >= 2**32 - 1:
                self.rerun_tables.fill(0)
                self.rerun_stamp = 0
            rank_from = limit if self.immediate else 0
            args = (0, self.counters[1:2], self.overflow_ids, 0, self.full, self.full // 2, self.rerun_stamp)
            args += (rank_from, self.rerun_tables, self.rerun_lists, self.rerun_counters, None)
            self.kernel((self.rerun_threads // self.BLOCK,), (self.BLOCK,), self._args(*args))
            self.rerun_stamp += count
        self.streamlines += count

    def result(self, provenance: dict | None = None) -> ProbResult:
        """The totals so far (waits for the queued launches)."""
        return self._result(self.totals, self.streamlines, provenance)

    def _result(self, totals, streamlines, provenance=None) -> ProbResult:
        paths, seed_targets, counters, rerun, *matrix = (self.backend.to_host(a) for a in totals)
        if rerun[1]:
            raise RuntimeError("probabilistic kernel: a streamline outgrew the largest visited-voxel set")
        return ProbResult(
            paths.reshape(self.field.shape).astype(np.int64),
            int(counters[0] + rerun[0]),
            seed_targets[:, : self.n_targets].astype(np.int64),
            streamlines,
            {
                "set_slots": self.slots,
                "rerun_large_sets": int(counters[2]),
                "threads": self.threads,
                "counting": "immediate" if self.immediate else "at end",
                **(provenance or {}),
            },
            steps=int(counters[3] + rerun[3]),
            seed_matrix=matrix[0].astype(np.int64) if matrix else None,
        )

    def snapshot(self, copy_stream, after=None):
        """Copy the totals, as they are once the queued launches are done, to pinned host memory
        on ``copy_stream`` (so the copy overlaps the next launch). Returns (ready event,
        function giving the :class:`ProbResult`)."""
        cp = self.cp
        compute = cp.cuda.get_current_stream()
        if after is not None:  # the previous copy has finished reading the snapshot buffers
            compute.wait_event(after)
        if not hasattr(self, "_snap"):
            self._snap = [cp.empty_like(a) for a in self.totals]
            self._pinned = [[_pinned_like(a) for a in self._snap] for _ in range(2)]
            self._turn = 0
        for dst, src in zip(self._snap, self.totals, strict=True):
            dst[...] = src
        taken = compute.record()
        copy_stream.wait_event(taken)
        host = self._pinned[self._turn]
        self._turn ^= 1
        for dst, src in zip(host, self._snap, strict=True):
            cp.cuda.runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, src.nbytes, 2, copy_stream.ptr)  # 2: D2H
        ready = copy_stream.record()
        streamlines = self.streamlines

        def result(provenance=None):
            ready.synchronize()
            return self._result(host, streamlines, provenance)

        return ready, result


def path_positions(total: int, most: int) -> np.ndarray:
    """Run positions of the streamlines to save: all of them, or the first ``most`` in the
    run's order — the first samples of every seed voxel alike (:func:`streamline_ids`)."""
    return np.arange(min(total, most), dtype=np.int64)


def _polylines(halves) -> list[np.ndarray]:
    """Each streamline's points (voxel coordinates) from the recorded steps of its two halves
    ((n, T, 4) each: x, y, z, alive): the second half reversed, then the first; a position
    is a point where it changed (a failed step leaves it)."""
    out = []
    for first, second in zip(*halves, strict=True):
        parts = []
        for steps in (second, first):
            xyz = steps[:, :3]
            moved = np.concatenate([[True], np.any(xyz[1:] != xyz[:-1], axis=1)])
            parts.append(xyz[moved])
        out.append(np.concatenate([parts[0][::-1], parts[1][1:]]).astype(np.float32))
    return out


def trace_paths(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    positions: np.ndarray,
    *,
    n_waypoints: int = 0,
    device="auto",
    chunk: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The streamlines at run positions ``positions`` as polylines (voxel coordinates), the
    same steps as the run's (same random streams): (polylines, seed voxel numbers, kept:
    not excluded and meeting the waypoint condition, as the run decides)."""
    backend = get_backend(device)
    positions = np.asarray(positions, dtype=np.int64)
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    ids, seed_of = streamline_ids(0, 0, len(seeds), params.n_samples, positions)
    per_streamline = 2 * (params.n_steps + 1) * 4 * 8  # the trace's bytes
    if backend.is_gpu:
        chunk = chunk or max(1, min(4096, backend.free_memory_bytes() // 8 // per_streamline))
        tracker = None
    else:
        chunk = chunk or max(1, NUMPY_BITMAP_BYTES // int(np.prod(field_.shape)))
    lines: list[np.ndarray] = []
    for start in range(0, len(positions), chunk):
        if cancelled is not None and cancelled():
            raise Cancelled()
        part = positions[start : start + chunk]
        if backend.is_gpu:
            cp = backend.xp
            if tracker is None:
                tracker = KernelTracker(backend, field_, bits, seeds, params, 0, n_waypoints, max_batch=chunk)
            trace = cp.zeros((len(part), 2, params.n_steps + 1, 4))
            tracker.launch(0, len(part), trace, cp.asarray(ids[start : start + chunk]))
            host = backend.to_host(trace)
            halves = (host[:, 0], host[:, 1])
        else:
            _, halves = track_numpy(field_, bits, seeds, params, 0, n_waypoints, record=True, positions=part)
        lines += _polylines(halves)
        if progress is not None:
            progress(min(start + chunk, len(positions)), len(positions))
    shape = np.array(field_.shape)
    hits = np.zeros(len(lines), dtype=np.uint32)
    for i, line in enumerate(lines):
        v = np.rint(line).astype(np.int64)
        v = v[((v >= 0) & (v < shape)).all(1)]
        hits[i] = np.bitwise_or.reduce(bits[tuple(v.T)].astype(np.uint32)) if len(v) else 0
    waymask = np.uint32(sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints)))
    kept = (hits & BIT_EXCLUDE) == 0
    if n_waypoints:
        kept &= (hits & waymask) == waymask if params.waycond == "AND" else (hits & waymask) != 0
    return lines, seed_of, kept


def upload_field(backend, field_: SampleField) -> tuple:
    """The field's arrays (dirs, f, index) on the device, for :func:`iter_track`'s ``device_field``."""
    if not backend.is_gpu:
        return tuple(np.ascontiguousarray(a) for a in (field_.dirs, field_.f, field_.index))
    from .transfer import to_device

    with backend.activate():
        return tuple(to_device(a) for a in (field_.dirs, field_.f, field_.index))


def _pinned_like(a):
    from .transfer import empty_pinned

    return empty_pinned(a.shape, a.dtype)


def track_kernel(
    backend,
    field_: SampleField,
    bits,
    seeds,
    params: ProbParams,
    n_targets=0,
    n_waypoints=0,
    first_id=0,
    count=None,
    *,
    threads=None,
    trace=False,
    device_field=None,
    set_slots=SET_SLOTS,
    seed_matrix=False,
):
    """:func:`track_numpy` as the CUDA kernel ``prob_track`` (one launch of a
    :class:`KernelTracker`). ``device_field``: the field's arrays already on the device (dirs,
    f, index); ``set_slots``: the first pass's set size (:func:`set_sizes`). Returns
    :class:`ProbResult` (and the (n, 2, n_steps + 1, 4) trace when ``trace``)."""
    n = len(seeds) * params.n_samples - first_id if count is None else count
    if n <= 0:
        empty = ProbResult(np.zeros(field_.shape, np.int64), 0, np.zeros((len(seeds), n_targets), np.int64), 0)
        return (empty, np.zeros((0, 2, params.n_steps + 1, 4))) if trace else empty
    tracker = KernelTracker(
        backend,
        field_,
        bits,
        seeds,
        params,
        n_targets,
        n_waypoints,
        max_batch=n,
        device_field=device_field,
        set_slots=set_slots,
        threads=threads,
        seed_matrix=seed_matrix,
    )
    tr = backend.xp.zeros((n, 2, params.n_steps + 1, 4)) if trace else None
    tracker.launch(first_id, n, tr)
    result = tracker.result()
    return (result, backend.to_host(tr)) if trace else result


#: Streamlines per batch: the GPU's (running totals about every 0.8 s on an H100: each
#: batch ends waiting for its longest streamline, so batches are not made smaller than
#: a viewer needs) and the bytes of the NumPy reference's dense visit bitmap.
GPU_BATCH = 8_000_000
NUMPY_BITMAP_BYTES = 256 * 2**20


def iter_track(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    *,
    n_targets: int = 0,
    n_waypoints: int = 0,
    device="auto",
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_streamlines: int | None = None,
    device_field=None,
    seed_matrix: bool = False,
) -> Iterator[ProbResult]:
    """Track every streamline of every seed voxel in batches, yielding the running totals
    (a fresh :class:`ProbResult`) after each, so a viewer can show the path distribution
    filling in; the last one is the result. ``engine``: ``"kernel"`` (GPU) or ``"numpy"``
    (the reference; the CPU default). ``cancelled()`` is polled between batches; when it
    says yes, the totals of every batch already computed are yielded (on the GPU the
    handed-out totals trail the queued batch by one) and then :class:`Cancelled` is
    raised. ``progress(done, total)`` comes with each yield. ``device_field``: the field's
    arrays (dirs, f, index) already on the GPU (:func:`upload_field`), to track from the
    same samples again without copying them (gigabytes for a whole brain). ``seed_matrix``:
    also count the seed × seed matrix (:class:`ProbResult`)."""
    backend = get_backend(device)
    engine = choose_engine(engine, backend, available=(KERNEL, NUMPY), method="probabilistic tracking")
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    n_vox = int(np.prod(field_.shape))
    batch = batch_streamlines or (GPU_BATCH if engine == "kernel" else max(1, NUMPY_BITMAP_BYTES // n_vox))
    t0 = time.perf_counter()

    def provenance(done: int) -> dict:
        elapsed = time.perf_counter() - t0
        return {
            "params": asdict(params),
            "engine": engine,
            "backend": backend.name,
            "device": backend.device_name,
            "tracking_s": elapsed,
            "streamlines_per_s": done / elapsed if elapsed > 0 else None,
        }

    def report(result: ProbResult) -> ProbResult:
        if progress is not None:
            progress(result.streamlines, total)
        return result

    batches = [(start, min(batch, total - start)) for start in range(0, total, batch)]
    if engine == "numpy":
        paths = np.zeros(field_.shape, dtype=np.int64)
        seed_targets = np.zeros((len(seeds), n_targets), dtype=np.int64)
        waytotal = steps = 0
        matrix = np.zeros((len(seeds), len(seeds)), dtype=np.int64) if seed_matrix else None
        for start, count in batches:
            if cancelled is not None and cancelled():
                raise Cancelled()
            part = track_numpy(
                field_, bits, seeds, params, n_targets, n_waypoints, start, count, seed_matrix=seed_matrix
            )
            if seed_matrix:
                matrix += part.seed_matrix
            paths += part.paths
            seed_targets += part.seed_targets
            waytotal += part.waytotal
            steps += part.steps
            done = start + count
            yield report(
                ProbResult(
                    paths.copy(),
                    waytotal,
                    seed_targets.copy(),
                    done,
                    provenance(done),
                    steps,
                    None if matrix is None else matrix.copy(),
                )
            )
        return
    # The GPU: totals accumulate on the device. After queueing a batch, its totals are copied
    # to the host on a second stream while the next batch runs, and the previous batch's are
    # handed out meanwhile, so the GPU never waits for the host.
    cp = backend.xp
    tracker = KernelTracker(
        backend,
        field_,
        bits,
        seeds,
        params,
        n_targets,
        n_waypoints,
        max_batch=batch,
        device_field=device_field,
        seed_matrix=seed_matrix,
    )
    copy_stream = cp.cuda.Stream(non_blocking=True)
    pending = copied = None
    for start, count in batches:
        if cancelled is not None and cancelled():
            if pending is not None:  # computed before the cancel: keep it
                yield report(pending(provenance(tracker.streamlines)))
            raise Cancelled()
        tracker.launch(start, count)
        copied, result = tracker.snapshot(copy_stream, after=copied)
        if pending is not None:
            yield report(pending(provenance(tracker.streamlines - count)))
        pending = result
    if pending is not None:
        yield report(pending(provenance(total)))


def track(field_: SampleField, bits: np.ndarray, seeds: np.ndarray, params: ProbParams, **kwargs) -> ProbResult:
    """:func:`iter_track` run to the end: the final totals."""
    last = deque(iter_track(field_, bits, seeds, params, **kwargs), maxlen=1)
    if last:
        return last[0]
    n_targets = kwargs.get("n_targets", 0)  # no seeds
    return ProbResult(np.zeros(field_.shape, np.int64), 0, np.zeros((0, n_targets), np.int64), 0)
