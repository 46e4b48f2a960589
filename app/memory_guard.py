"""Host memory a CPU job will need, estimated before it starts, and the refusal when the machine
does not have it free: a clear error (the need, what is free, what to change) instead of a
laptop swapping to a halt.

Each estimate is the job's peak above what the process held when it started (its inputs
already in memory): the largest of its phases, each the sum of the arrays alive then, from
the sizes the engine documents (:data:`gpu.commit_segments.HOST_SEGMENT_BYTES`, :func:`gpu.commit_solver.fista_host_bytes`,
…), plus :data:`RUNTIME_BYTES` for the compiled loops and allocator slack. What depends on
the streamlines' geometry is measured on the job's own streamlines: segments per point on a
sample (:data:`SEGMENT_SAMPLE_MARGIN` on top); the fitted voxels and COMMIT's distinct
(voxel, orientation) pairs over all the points, in one threaded pass (:func:`traversal`:
pairs are shared between the streamlines of a bundle, which a sample does not see). COMMIT's
fit is checked again once its segments and EC compartments exist, with their exact counts
(:func:`check_commit_fit_memory`). tests/test_memory_guard.py checks in a subprocess that a
job's peak stays below its announcement.

``TRACTLENS_MEMORY_GUARD=off`` runs a job whatever its estimate (at the user's risk).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np

from tractlens.gpu import commit, commit_ec, commit_operator, commit_segments, commit_solver
from tractlens.gpu.backend import get_backend
from tractlens.gpu.commit_host import CPU_FIT_DTYPE, MODEL_HOST_BYTES, host_operator_bytes
from tractlens.gpu.host import host_threads, numba_module, release_freed_memory, run_in_order

from .errors import InputError

__all__ = [
    "GUARD_ENV",
    "MemoryNeed",
    "check_commit_fit_memory",
    "check_commit_memory",
    "check_host_memory",
    "commit_fit_need",
    "commit_host_need",
    "host_free_bytes",
    "tracking_host_need",
    "traversal",
    "traversed_voxels",
]

GUARD_ENV = "TRACTLENS_MEMORY_GUARD"
#: Thread stacks, imports and allocator slack
RUNTIME_BYTES = 192 << 20
#: numba's compiler the first time a CPU engine's loops are used in a process (about 100 MB
#: when they load from numba's disk cache; up to ~400 MB when they compile, once per install)
COMPILE_BYTES = 448 << 20


def runtime_bytes(loops_module: str) -> int:
    """:data:`RUNTIME_BYTES`, plus :data:`COMPILE_BYTES` while the compiled loops of
    ``gpu.<loops_module>`` are not yet loaded in this process (and numba is installed)."""
    import sys

    from tractlens.gpu.host import numba_module

    loaded = f"tractlens.gpu.{loops_module}" in sys.modules
    return RUNTIME_BYTES + (0 if loaded or numba_module() is None else COMPILE_BYTES)


#: Streamlines cut to measure segments per point (evenly spaced through the tractogram)
SAMPLE_STREAMLINES = 2000
#: Head-room on what a sample measured (tracking's points per seed)
SAMPLE_MARGIN = 1.25
#: ... on the segments per point: a property of each streamline (no sharing), whose mean over
#: the evenly spaced sample is within a few per cent of the whole's (the whole when it is small)
SEGMENT_SAMPLE_MARGIN = 1.1
#: Working memory of cutting one chunk of streamlines, per point (gpu.commit: ~0.6 kB at the peak)
CUT_BYTES_PER_POINT = 640
#: Points read at a time when the voxels that the streamlines pass through are counted
VOXEL_COUNT_CHUNK = 1 << 18
#: Points a thread takes at a time when the steps' (voxel, orientation) pairs are hashed
PAIR_BLOCK_POINTS = 1 << 16
#: Distinct hashed pairs kept at most when the EC compartments are counted (:func:`traversal`):
#: 4 MB of hashes, a relative standard error of at most 0.2 % on the count
PAIR_SAMPLE_KEYS = 1 << 19
#: Head-room on the counted (voxel, orientation) pairs: the voxels between a step's ends (a step
#: crossing two planes at once) are not counted, and the count's sampling error
EC_PAIR_MARGIN = 1.1
#: Beyond this many voxels a step, the count of voxels passed through falls back to every usable voxel
MAX_STEP_VOXELS = 4
#: Bytes of float64 signal per block of voxel rows when the error maps are made from blocks of A x
#: (app.pipelines.commit.MAP_BLOCK_BYTES; each thread holds its block, A x's and a difference)
MAP_BLOCK_BYTES = 4 << 20


@dataclass
class MemoryNeed:
    """A job's estimated peak of host memory, and what it is made of (bytes)."""

    job: str
    total: int
    parts: dict[str, int] = field(default_factory=dict)
    #: Choices the estimate made for the job to keep its peak low (e.g. COMMIT's cut in two passes),
    #: and the counts it assumed
    plan: dict = field(default_factory=dict)

    def describe(self) -> str:
        biggest = sorted(self.parts.items(), key=lambda kv: -kv[1])[:3]
        return ", ".join(f"{name} {_gib(size)}" for name, size in biggest)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.0f} MiB"


def host_free_bytes() -> int:
    """What new allocations can use without swapping (the kernel's MemAvailable)."""
    return get_backend("cpu").free_memory_bytes()


def check_host_memory(need: MemoryNeed, fix: str, *, free: int | None = None, held: int = 0) -> None:
    """Refuse the job (:class:`InputError`) when ``need`` exceeds the free host memory, saying
    the need, what is free and ``fix`` (what to change). ``held``: bytes of ``need`` the job
    already holds (made before this check: not in what is free any more). ``TRACTLENS_MEMORY_GUARD=off``
    skips it."""
    if os.environ.get(GUARD_ENV, "").lower() in ("off", "0", "no"):
        return
    free = host_free_bytes() if free is None else free
    if need.total - held <= free:
        return
    holds = f", {_gib(held)} of it already held" if held else ""
    raise InputError(
        f"{need.job} on the CPU needs about {_gib(need.total)} of memory ({need.describe()}){holds}, "
        f"but only {_gib(free)} is free: it was not started, rather than make the computer swap",
        fix=f"{fix}; or close other programs; or set {GUARD_ENV}=off to run it anyway",
    )


def _sample(tractogram, n: int):
    """Points and offsets of up to ``n`` streamlines evenly spaced through ``tractogram``."""
    offsets = np.asarray(tractogram.offsets, dtype=np.int64)
    total = len(offsets) - 1
    pick = np.unique(np.linspace(0, total - 1, min(n, total)).astype(np.int64))
    parts = [np.asarray(tractogram.points[offsets[i] : offsets[i + 1]]) for i in pick]
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    return np.concatenate(parts), np.r_[0, np.cumsum(lengths)]


@dataclass
class Traversal:
    """What one pass over a tractogram's points measured (:func:`traversal`)."""

    #: usable voxels the segments can lie in (:func:`traversed_voxels`)
    voxels: int
    #: estimated distinct (usable voxel, orientation bin) pairs of the steps (None: not counted)
    ec_pairs: int | None = None


def traversed_voxels(tractogram, rows: np.ndarray, to_voxel) -> int:
    """Usable voxels (``rows`` ≥ 0) that the streamlines' segments can lie in, counted in one
    chunked pass over the points: the voxels of the points, grown by the longest step (a
    straight step whose ends are at most k voxels apart on each axis stays within k voxels of
    its first point's voxel), then kept where usable. COMMIT fits these voxels only; every
    usable voxel (a whole-brain mask) can be 3–4 times as many. Where a step is longer than
    :data:`MAX_STEP_VOXELS` (a compressed tractogram) it is every usable voxel."""
    return traversal(tractogram, rows, to_voxel).voxels


def _starts_within(offsets: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The streamlines' first points (sorted ``offsets``) in lo < i < hi (a search, not a pass
    over all the offsets for each chunk)."""
    return offsets[np.searchsorted(offsets, lo, "right") : np.searchsorted(offsets, hi, "left")]


def _mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of int64 ``keys`` as uint64: a bijection (distinct keys, distinct
    hashes) whose every output bit depends on every input bit, so a fixed range of hashes is a
    random-like subset of any set of keys, however regular (neighbouring voxels, bins)."""
    h = keys.view(np.uint64).copy()
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def _kept(hashes: np.ndarray, level: int) -> np.ndarray:
    """``hashes`` in the lowest 1/2**level of the range (all at level 0)."""
    return hashes if level == 0 else hashes[(hashes >> np.uint64(64 - level)) == 0]


def _step_pair_hashes(p32, first: int, offsets, affine, voxel_size, rows_flat, shape, level: int) -> np.ndarray:
    """Distinct hashes (:func:`_mix`, kept at ``level``) of the (voxel, orientation bin) pairs of
    the steps between consecutive points ``p32`` (points ``first`` … of the tractogram): each
    step's bin as :func:`gpu.commit.orientation_index` gives its segments (float64, the step in
    mm), with the usable voxel of either end (its segments lie there, and in the voxels between
    when it crosses two planes at once: not counted, :data:`EC_PAIR_MARGIN` covers them)."""
    p = p32.astype(np.float64)
    if affine is not None:  # the same arithmetic as gpu.commit_segments (float64), by columns
        p = p[:, :1] * affine[:3, 0] + p[:, 1:2] * affine[:3, 1] + p[:, 2:] * affine[:3, 2] + affine[:3, 3]
    step = p[1:] - p[:-1]
    step *= voxel_size
    ok = (step != 0).any(1)
    ends = _starts_within(offsets, first, first + len(p)) - first - 1
    ok[ends] = False  # from one streamline to the next
    k = np.flatnonzero(ok)
    if not len(k):
        return np.zeros(0, np.uint64)
    orient = commit.orientation_index(step[k]).astype(np.int64)
    vox = np.floor(p + 0.5).astype(np.int64)
    inside = ((vox >= 0) & (vox < shape)).all(1)
    flat = (vox[:, 0] * shape[1] + vox[:, 1]) * shape[2] + vox[:, 2]
    flat = np.where(inside & (rows_flat[np.where(inside, flat, 0)] >= 0), flat, -1)
    keys = []
    for end in (flat[k], flat[k + 1]):
        usable = end >= 0
        keys.append(end[usable] * commit.N_ORIENTATIONS + orient[usable])
    return np.unique(_kept(_mix(np.concatenate(keys)), level))


def traversal(tractogram, rows: np.ndarray, to_voxel, voxel_size=None) -> Traversal:
    """One threaded pass over the points, a chunk at a time: :func:`traversed_voxels`, and with
    ``voxel_size`` the distinct (usable voxel, orientation bin) pairs of the steps between
    consecutive points, which are COMMIT's EC compartments without a peaks file
    (:func:`gpu.commit_operator.ec_from_segments`; :func:`_step_pair_hashes`).

    The pairs are counted without holding them all (a whole brain has tens of millions) by
    adaptive hash sampling: each pair is hashed (a bijection of its int64 key) and kept where the
    hash falls in the lowest 1/R of the range, R = 2**level; whenever the distinct kept hashes
    exceed :data:`PAIR_SAMPLE_KEYS`, R doubles and they are filtered again. The estimate is the
    distinct kept hashes × R: exact while R = 1 (fewer pairs than the cap), else each pair is
    kept with probability 1/R independently of the others (for a well-mixed hash), so its
    relative standard error is sqrt((1 − 1/R) / kept) ≤ sqrt(2 / PAIR_SAMPLE_KEYS) ≈ 0.2 %
    (kept ≥ half the cap once R > 1); tests/test_memory_guard.py compares it with the exact count."""
    usable = rows >= 0
    n_usable = int(usable.sum())
    offsets = np.asarray(tractogram.offsets, dtype=np.int64)
    n_points = int(offsets[-1]) if len(offsets) else 0
    if n_points == 0 or n_usable == 0:
        return Traversal(0, None if voxel_size is None else 0)
    padded = np.zeros(tuple(n + 2 for n in rows.shape), dtype=bool)  # points outside: on its border
    flat = padded.reshape(-1)
    stride_i, stride_j = padded.shape[1] * padded.shape[2], padded.shape[2]
    top = np.array(rows.shape, dtype=np.float32)
    # float32 as stored; +0.5 folded into the translation: a voxel is floor(coordinate + 0.5)
    affine = None if to_voxel is None else np.asarray(to_voxel, dtype=np.float64)
    linear = None if affine is None else affine[:3, :3].T.astype(np.float32)
    shift = np.float32(0.5) + (0 if affine is None else affine[:3, 3].astype(np.float32))
    rows_flat = rows.reshape(-1)
    sizes = None if voxel_size is None else np.asarray(voxel_size, dtype=np.float64)
    level = [0]  # of the pairs' sampling: raised by the thread that merges, read by the others

    def mark(lo: int):
        """Marks the voxels of points lo … lo + chunk; the longest step there (inf: not finite),
        and the hashes of the steps' pairs kept at the level of the moment."""
        hi = min(n_points, lo + VOXEL_COUNT_CHUNK + 1)  # one point more: the step across chunks
        p = np.asarray(tractogram.points[lo:hi], dtype=np.float32)
        if linear is None:
            v = p + shift
        else:  # three columns, not a matmul (a BLAS call per chunk)
            v = p[:, :1] * linear[0] + p[:, 1:2] * linear[1] + p[:, 2:] * linear[2] + shift
        d = v[1:] - v[:-1]
        d[_starts_within(offsets, lo, hi) - lo - 1] = 0.0  # from one streamline to the next
        step = float(np.abs(d, out=d).max()) if len(d) else 0.0
        if not (np.isfinite(step) and np.isfinite(v).all()):
            return np.inf, None
        np.clip(v, -1.0, top, out=v)
        ix = np.floor(v, out=v).astype(np.int64) + 1
        flat[ix[:, 0] * stride_i + ix[:, 1] * stride_j + ix[:, 2]] = True  # writes of True only: threads may share
        del v, d, ix
        if sizes is None:
            return step, None
        parts = []  # blocks of points (and the next one): float64 temporaries of a few MB a thread
        for a in range(0, len(p) - 1, PAIR_BLOCK_POINTS):
            block = p[a : a + PAIR_BLOCK_POINTS + 1]
            parts.append(_step_pair_hashes(block, lo + a, offsets, affine, sizes, rows_flat, rows.shape, level[0]))
        return step, np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    kept, pending, longest = np.zeros(0, np.uint64), [], 0.0

    def merge(kept: np.ndarray, pending: list) -> np.ndarray:
        kept = np.unique(np.concatenate([kept, *[_kept(h, level[0]) for h in pending]]))
        while len(kept) > PAIR_SAMPLE_KEYS:
            level[0] += 1
            kept = _kept(kept, level[0])
        return kept

    chunks = (functools.partial(mark, lo) for lo in range(0, n_points, VOXEL_COUNT_CHUNK))
    for step, hashes in run_in_order(chunks, host_threads()):
        longest = max(longest, step)
        if hashes is not None:
            pending.append(hashes)
            if sum(len(h) for h in pending) > PAIR_SAMPLE_KEYS:
                kept, pending = merge(kept, pending), []
    pairs = None if sizes is None else len(merge(kept, pending)) << level[0]
    if not longest <= MAX_STEP_VOXELS:  # also an infinite or NaN coordinate
        return Traversal(n_usable, pairs)
    hit = padded[1:-1, 1:-1, 1:-1]
    from scipy.ndimage import maximum_filter  # separable: cheap on a whole grid

    grow = max(1, int(np.ceil(longest)))  # at least one: float32 rounding at a voxel's border
    hit = maximum_filter(hit, size=2 * grow + 1, mode="constant", cval=False)
    return Traversal(int((hit & usable).sum()), pairs)


def commit_host_need(
    tractogram,
    rows: np.ndarray,
    voxel_size,
    to_voxel,
    n_meas: int,
    params: commit.CommitParams,
    *,
    signal_itemsize: int = 4,
    peaks_per_voxel: int | None = None,
) -> MemoryNeed:
    """Peak host memory of COMMIT's CPU pipeline (:func:`app.pipelines.commit.commit_pipeline`)
    on ``tractogram`` over the usable voxels ``rows`` (−1 elsewhere), before its segments exist.

    Phases: the look-up tables made (in float64, before the cut), with numba's compiler (its
    allowance in ``runtime``); cutting, beside the tables; and the fit (:func:`commit_fit_parts`).
    The fitted voxels and, without a peaks file or ``ec_orientations``, the EC compartments
    (distinct (voxel, orientation) pairs, with :data:`EC_PAIR_MARGIN`) are counted in one pass
    over the points (:func:`traversal`); the segments per point on a sample of streamlines.

    Cutting keeps the chunks' segments until all are counted, then moves them into row order
    field by field (:data:`~gpu.commit_segments.HOST_CUT_PEAK_BYTES` a segment), or, in two
    passes, counts first and cuts again into the final arrays (the segments once); each cutting
    thread adds its chunk of working memory. Two passes cost a second cut and are planned
    (``plan["two_pass_cut"]``) where one pass may be the job's peak (with many segments and few
    voxels × measurements): where it would be, were the EC compartments as few as the sample's."""
    n_points = len(tractogram.points)
    n_fibers = len(tractogram)
    points, offsets = _sample(tractogram, SAMPLE_STREAMLINES)
    seg = commit_segments.segments(
        points, offsets, rows, voxel_size, min_length_mm=params.min_segment_mm, to_voxel=to_voxel
    )
    per_point = len(seg) / max(1, len(points))
    n_seg = int(SEGMENT_SAMPLE_MARGIN * per_point * n_points) + 1000
    count_pairs = peaks_per_voxel is None and not params.ec_orientations
    passed = traversal(tractogram, rows, to_voxel, voxel_size if count_pairs else None)
    n_rows = passed.voxels  # the voxels that can be fitted
    if peaks_per_voxel is not None:
        n_ec = least_ec = n_rows * peaks_per_voxel
    elif params.ec_orientations:  # at most that many a voxel (gpu.commit_ec)
        n_ec = min(n_seg, params.ec_orientations * n_rows)
        least_ec = len(commit_ec.ec_main_orientations(seg, params.ec_orientations)[0]) if len(seg) else 0
    else:  # the pairs of the whole, counted (a sample's would miss their sharing: ~20 times as many)
        n_ec = min(n_seg, int(EC_PAIR_MARGIN * passed.ec_pairs) + 1000)
        least_ec = len(commit_operator.ec_from_segments(seg)[0]) if len(seg) else 0  # the sample's
    chunk, threads = commit_segments.host_cut_plan()  # each thread cuts its own chunk
    working = CUT_BYTES_PER_POINT * min(n_points, chunk * threads)

    def fitting_with(n_ec: int) -> dict[str, int]:
        return commit_fit_parts(n_seg, n_rows, n_ec, n_fibers, n_meas, params)

    fitting = fitting_with(n_ec)
    segments, tables = fitting["segments"], fitting["look-up tables"]  # tables: kept (float32)
    tables_made = tables + (params.n_ic + 3) * commit.N_ORIENTATIONS * n_meas * 8  # float64 while made, before the cut
    one_pass = commit_segments.HOST_CUT_PEAK_BYTES * n_seg + working
    # a second cut wherever one pass may be the job's peak: even with the fewest EC compartments
    two_pass = one_pass > max(tables_made, sum(fitting_with(least_ec).values()))
    cutting = tables + (segments + working if two_pass else one_pass)  # the tables kept meanwhile
    runtime = runtime_bytes("commit_loops")
    parts = {"segments while cut": cutting, "look-up tables while made": tables_made, **fitting, "runtime": runtime}
    total = max(cutting, tables_made, sum(fitting.values())) + runtime
    return MemoryNeed(
        "COMMIT", int(total), parts, {"two_pass_cut": two_pass, "segments": n_seg, "ec_compartments": n_ec}
    )


def commit_fit_parts(n_seg: int, n_rows: int, n_ec: int, n_fibers: int, n_meas: int, params) -> dict[str, int]:
    """Host bytes alive at the peak of COMMIT's CPU fit: the segments once
    (:data:`~gpu.commit_segments.HOST_SEGMENT_BYTES` a segment, their rows as one start per
    voxel row), the look-up tables, the measured and modelled signal, FISTA's vectors, the
    operator's per-thread accumulators. The signal is held once in FISTA's type
    (:data:`~gpu.commit_host.CPU_FIT_DTYPE`); FISTA's column vectors, or the modelled signal
    (float64, whole when small, else blocks of rows) after the fit, are alive one after the other."""
    n_ic = params.n_ic
    n_values = n_rows * n_meas
    fit_itemsize = np.dtype(CPU_FIT_DTYPE).itemsize
    n_cols = n_ic * n_fibers + n_ec + n_rows * len(params.d_iso)
    if fit_itemsize == 4 and numba_module() is not None:  # commit_solver.fista_fused
        # 1/scale (the caller's scale, inverted in place), x, z, the gradient: no vector per
        # measurement (A x and A z are made row by row in each iteration's one visit)
        solver = 8 * n_cols + commit_solver.fista_fused_host_bytes(n_cols, n_values)
        # after it: x, and A x whole (float64) when small, else blocks of rows per thread
        model = min(8 * n_values, MODEL_HOST_BYTES) + host_threads() * 3 * MAP_BLOCK_BYTES
    else:  # float64 data: its quotient is made, then taken once in FISTA's type;
        # both alive then (12 B a value) with none of FISTA's vectors: within signal + fit vectors
        solver = commit_solver.fista_host_bytes(n_cols, n_values, fit_itemsize)
        model = 8 * n_values  # A x in float64, after FISTA's vectors are gone
    return {
        "segments": commit_segments.HOST_SEGMENT_BYTES * n_seg + commit_segments.HOST_ROW_BYTES * (n_rows + 1),
        "look-up tables": (n_ic + 1) * commit.N_ORIENTATIONS * n_meas * 4,  # float32
        "signal": n_values * fit_itemsize,
        "fit vectors": max(solver, model + 8 * 2 * n_cols) + 16 * n_ec,
        "operator": host_operator_bytes(n_rows, n_fibers, n_ic, n_meas),
    }


def commit_fit_need(
    n_seg: int, n_rows: int, n_ec: int, n_fibers: int, n_meas: int, params, runtime: int = RUNTIME_BYTES
) -> MemoryNeed:
    """The fit phase of :func:`commit_host_need` from the job's exact counts, once its segments
    and EC compartments exist, with ``runtime`` (:func:`runtime_bytes`) on top."""
    parts = {**commit_fit_parts(n_seg, n_rows, n_ec, n_fibers, n_meas, params), "runtime": runtime}
    plan = {"segments": n_seg, "voxels": n_rows, "ec_compartments": n_ec}
    return MemoryNeed("COMMIT", int(sum(parts.values())), parts, plan)


def commit_memory_fix(peaks, params) -> str:
    """What to change when a COMMIT job on the CPU is refused for its memory."""
    fewer_ec = peaks is None and not params.ec_orientations
    return (
        "Give a white-matter mask (fewer voxels), fewer streamlines (select or subsample the tractogram), "
        + ("fewer extra-cellular compartments (--ec-orientations 3: each voxel's main orientations, other "
           "weights), " if fewer_ec else "")
        + "or run on a GPU (--device gpu)"
    )  # fmt: skip


def check_commit_fit_memory(
    seg, n_rows: int, n_ec: int, n_fibers: int, n_meas: int, params, peaks, runtime: int = RUNTIME_BYTES
) -> MemoryNeed:
    """:func:`commit_fit_need` of a COMMIT job whose segments ``seg`` and ``n_ec`` EC compartments
    were made (the counts exact now, not estimated), refused before the fit when what it has not
    yet allocated (all but the segments and the look-up tables) is not free; the need.
    ``runtime``: the job's first estimate's (with numba's compiler when the job loaded the
    loops: what they hold stays resident)."""
    need = commit_fit_need(len(seg), n_rows, n_ec, n_fibers, n_meas, params, runtime)
    held = need.parts["segments"] + need.parts["look-up tables"]
    release_freed_memory()  # the EC compartments' temporaries, freed in the heap: what is free, truly
    check_host_memory(need, commit_memory_fix(peaks, params), held=held)
    return need


#: Host bytes per kept point of a tracking job that keeps its streamlines: float32 position and
#: FA in the parts, then once more when the parts are joined
TRACK_BYTES_PER_POINT = 2 * (12 + 4)
#: ... and per kept streamline (offsets, length, seed index, stop codes, in parts and joined)
TRACK_BYTES_PER_STREAMLINE = 2 * (8 + 4 + 8 + 2)
#: Seeds tracked to measure points per seed (evenly spaced through the job's seeds)
SAMPLE_SEEDS = 256


def tracking_host_need(
    points_per_seed: float,
    n_seeds: int,
    batch_seeds: int,
    seed_bytes: int,
    *,
    kept: bool,
    piece_points: int,
    runtime: int | None = None,
) -> MemoryNeed:
    """Peak host memory of a tracking job on the CPU: one batch's working memory
    (``batch_seeds`` × ``seed_bytes``) and the streamlines kept (``points_per_seed``, measured on
    a sample, × the seeds) — or, when they go to a sink (a file), one piece of
    ``piece_points`` points at a time. ``runtime``: :func:`runtime_bytes` taken before the
    sample was tracked (default: now)."""
    points = SAMPLE_MARGIN * points_per_seed * n_seeds
    if kept:
        output = TRACK_BYTES_PER_POINT * points + TRACK_BYTES_PER_STREAMLINE * n_seeds
    else:
        output = TRACK_BYTES_PER_POINT * min(points, piece_points)
    runtime = runtime_bytes("deterministic_loops") if runtime is None else runtime
    parts = {"tracking batch": int(batch_seeds * seed_bytes), "streamlines": int(output), "runtime": runtime}
    return MemoryNeed("Tracking", int(sum(parts.values())), parts)


def check_commit_memory(dwi, tractogram, rows, voxel_size, to_voxel, params, peaks) -> MemoryNeed:
    """:func:`commit_host_need` of a COMMIT job on the CPU, refused when it is not free; the
    need, whose plan the job follows."""
    from .io.nifti import load_image

    shape = None if peaks is None else load_image(peaks, "peaks file").shape
    per_voxel = shape[3] // 3 if shape is not None and len(shape) == 4 else None
    need = commit_host_need(
        tractogram, rows, voxel_size, to_voxel, len(dwi.bvals), params,
        signal_itemsize=np.dtype(dwi.data.dtype).itemsize, peaks_per_voxel=per_voxel,
    )  # fmt: skip
    check_host_memory(need, commit_memory_fix(peaks, params))
    return need
