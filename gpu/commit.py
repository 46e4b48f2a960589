"""COMMIT: Convex Optimization Modeling for Microstructure Informed Tractography
(Daducci et al. 2015, IEEE TMI 34(1): the linear model y = A x, x ≥ 0, solved as a
non-negative least-squares problem).

The measured signal of every voxel in a mask, normalised by the voxel's mean b=0
signal, is modelled as ``y = A x`` with ``x ≥ 0`` and three groups of columns:

- IC, one column per streamline: each of its segments in voxel v, of length ℓ mm and
  orientation o, adds ``ℓ · LUT_IC[o, :]`` to voxel v's measurements (the
  intra-axonal response rotated to o);
- EC, one column per (voxel, orientation) compartment: ``LUT_EC[o, :]`` in its voxel;
- ISO, one column per voxel and isotropic response: ``LUT_ISO[j, :]`` in its voxel.

Responses are pre-rotated into look-up tables over a discretised half sphere, as in
COMMIT: azimuth φ and polar angle θ in whole degrees, 0..180 each (181² = 32 761
orientations); a direction maps to the nearest after flipping it into φ ∈ [0°, 180°].
Models (diffusivities in mm²/s):

- ``stick-zeppelin-ball`` (COMMIT 2's defaults): IC a stick (d_par = 1.7e-3), EC a
  zeppelin (d_par, d_perp = 0.51e-3), ISO balls (d_iso = 1.7e-3 and 3.0e-3).
- ``cylinder-zeppelin-ball`` (the cylinder model of Daducci et al. 2015): IC one response per axon radius
  (default 1, 2, 4 and 8 µm), each a cylinder: free diffusion d_par along the axis times
  the restricted signal across it (Van Gelderen et al. 1994, the pulsed-gradient
  spin-echo series; needs the pulse duration δ and separation Δ, which NIfTI/FSL files do
  not carry); EC and ISO as above. A streamline then has one column per radius, and its
  weight is their sum (as COMMIT's ``stat_coeffs='sum'``).

The cylinder series is sometimes printed with Y(x) = exp(+dβ²x); the exponent is
negative (Van Gelderen et al. 1994), or the series diverges.

Streamlines become segments (:func:`segments`): every polyline segment is split exactly
where it crosses a voxel boundary, pieces outside the mask are dropped, and pieces of
one streamline in one voxel with one orientation are merged (summed lengths).

The fit minimises ``½‖Ax − y‖² + λ‖x_IC‖₁`` over ``x ≥ 0`` with FISTA on unit-norm
columns (step 1/L, L from a power iteration), stopping when the objective changes by
less than ``tol`` relatively. A streamline with weight 0 does not contribute and is
filtered out.

The operator is applied with segments sorted by voxel (A·x: one row block per voxel,
no atomics) and the per-segment dot products summed per streamline through a
streamline-sorted permutation (Aᵀ·y), in float64; :func:`apply_a_numpy` and
:func:`apply_at_numpy` are the NumPy reference, :func:`sparse_matrix` the explicit
SciPy matrix for small problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .backend import Cancelled
from .params import meta

N_AZIMUTH = N_POLAR = 181
N_ORIENTATIONS = N_AZIMUTH * N_POLAR
MODELS = ("stick-zeppelin-ball", "cylinder-zeppelin-ball")
GAMMA = 2.6751525e8  # proton gyromagnetic ratio, rad s⁻¹ T⁻¹


@dataclass(frozen=True)
class CommitParams:
    """The model and the fit's settings (COMMIT 2's defaults)."""

    model: str = field(
        default="stick-zeppelin-ball", metadata=meta("Model", "the forward model's compartments", choices=MODELS)
    )
    d_par: float = field(
        default=1.7e-3, metadata=meta("d∥", "axial diffusivity of stick and zeppelin", "mm²/s", cli=False)
    )
    d_perp: float = field(
        default=0.51e-3, metadata=meta("d⊥", "radial diffusivity of the zeppelin", "mm²/s", cli=False)
    )
    d_iso: tuple[float, ...] = field(
        default=(1.7e-3, 3.0e-3), metadata=meta("d iso", "ball diffusivities", "mm²/s", cli=False)
    )
    lambda_: float = field(
        default=0.0, metadata=meta("λ", "ℓ1 weight on the streamline weights", "", (0.0, 1e6), flags=("--lambda",))
    )
    max_iter: int = field(default=1000, metadata=meta("Iterations", "FISTA iterations at most", "", (1, 10**6)))
    tol: float = field(default=1e-3, metadata=meta("Tolerance", "stop when the objective changes less", "", (0.0, 0.5)))
    min_segment_mm: float = field(
        default=1e-3, metadata=meta("Shortest segment", "shorter pieces are dropped", "mm", cli=False)
    )
    radii_um: tuple[float, ...] = field(
        default=(1.0, 2.0, 4.0, 8.0),
        metadata=meta(
            "Axon radii",
            "one cylinder response per radius",
            "µm",
            flags=("--radii",),
            nargs="+",
            metavar="UM",
            cli_help="cylinder-zeppelin-ball: axon radii in µm, one response each",
        ),
    )
    small_delta_ms: float | None = field(
        default=None,
        metadata=meta(
            "δ",
            "gradient pulse duration (cylinder model)",
            "ms",
            (0.0, 1000.0),
            flags=("--small-delta",),
            metavar="MS",
            cli_help="cylinder-zeppelin-ball: pulse duration δ",
        ),
    )
    big_delta_ms: float | None = field(
        default=None,
        metadata=meta(
            "Δ",
            "gradient pulse separation (cylinder model)",
            "ms",
            (0.0, 1000.0),
            flags=("--big-delta",),
            metavar="MS",
            cli_help="cylinder-zeppelin-ball: pulse separation Δ",
        ),
    )

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: one of {', '.join(MODELS)}")
        if self.model == "cylinder-zeppelin-ball":
            if self.small_delta_ms is None or self.big_delta_ms is None:
                raise ValueError(
                    "the cylinder-zeppelin-ball model needs the gradient timing: the pulse duration δ and "
                    "separation Δ in ms (--small-delta, --big-delta; e.g. HCP: 10.6 and 43.1)"
                )
            if not 0 < self.small_delta_ms <= self.big_delta_ms:
                raise ValueError(f"need 0 < δ ≤ Δ, got δ = {self.small_delta_ms} ms, Δ = {self.big_delta_ms} ms")
            if not self.radii_um or min(self.radii_um) <= 0:
                raise ValueError("axon radii must be positive (µm)")
        if not (self.d_par > 0 and self.d_perp >= 0 and all(d >= 0 for d in self.d_iso)):
            raise ValueError("diffusivities must be positive (mm²/s, e.g. 1.7e-3)")
        if self.d_par > 0.1:
            raise ValueError(f"d_par = {self.d_par} is not in mm²/s (expected about 1.7e-3)")
        if self.lambda_ < 0 or self.max_iter < 1 or not 0 <= self.tol < 1:
            raise ValueError("lambda must be >= 0, max_iter >= 1 and 0 <= tol < 1")

    @property
    def n_ic(self) -> int:
        """IC responses (columns) per streamline."""
        return len(self.radii_um) if self.model == "cylinder-zeppelin-ball" else 1


# ------------------------------------------------------------------ orientations and tables
def orientation_directions() -> np.ndarray:
    """(32761, 3) unit vectors of the look-up tables' orientations, index φ · 181 + θ (degrees)."""
    phi = np.deg2rad(np.arange(N_AZIMUTH))[:, None]
    theta = np.deg2rad(np.arange(N_POLAR))[None, :]
    d = np.stack(
        [
            np.sin(theta) * np.cos(phi),
            np.sin(theta) * np.sin(phi),
            np.broadcast_to(np.cos(theta), (N_AZIMUTH, N_POLAR)),
        ],
        -1,
    )
    return d.reshape(-1, 3)


def orientation_index(directions, xp=np):
    """Look-up table index of each (non-zero) direction (N, 3), sign ignored (``xp``: the
    array module of ``directions``)."""
    d = xp.asarray(directions, dtype=xp.float64)
    d = d / xp.sqrt((d**2).sum(-1, keepdims=True))
    phi = xp.degrees(xp.arctan2(d[:, 1], d[:, 0]))
    theta = xp.degrees(xp.arccos(xp.clip(d[:, 2], -1.0, 1.0)))
    flip = phi < 0  # the opposite direction: φ + 180°, 180° − θ
    phi = xp.where(flip, phi + 180.0, phi)
    theta = xp.where(flip, 180.0 - theta, theta)
    return (xp.rint(phi).astype(xp.int64) * N_POLAR + xp.rint(theta).astype(xp.int64)).astype(xp.int32)


def cylinder_perpendicular_log(b, radius_m: float, d: float, small_delta: float, big_delta: float, terms: int = 60):
    """ln of the signal across a cylinder of radius ``radius_m`` (m) per unit of sin²(angle to
    the axis), for b-values ``b`` (s/mm²), intra-axonal diffusivity ``d`` (mm²/s) and pulse
    duration / separation (s): Van Gelderen's series, ``ln S⊥ = −2γ²G⊥² Σ_m [2Dα²δ − 2 +
    2e^(−Dα²δ) + 2e^(−Dα²Δ) − e^(−Dα²(Δ−δ)) − e^(−Dα²(Δ+δ))] / [D²α⁶(R²α² − 1)]``, α_m R the
    roots of J1′, and G from b = γ²G²δ²(Δ − δ/3)."""
    from scipy.special import jnp_zeros

    b_si = np.asarray(b, dtype=np.float64) * 1e6  # s/m²
    dd = d * 1e-6  # m²/s
    g2 = b_si / (GAMMA**2 * small_delta**2 * (big_delta - small_delta / 3.0))
    alpha = jnp_zeros(1, terms) / radius_m
    a2 = dd * alpha**2
    numerator = (
        2 * a2 * small_delta
        - 2
        + 2 * np.exp(-a2 * small_delta)
        + 2 * np.exp(-a2 * big_delta)
        - np.exp(-a2 * (big_delta - small_delta))
        - np.exp(-a2 * (big_delta + small_delta))
    )
    series = (numerator / (dd**2 * alpha**6 * (radius_m**2 * alpha**2 - 1))).sum()
    return -2 * GAMMA**2 * g2 * series


def lookup_tables(bvals: np.ndarray, bvecs: np.ndarray, params: CommitParams) -> dict[str, np.ndarray]:
    """Responses on every orientation: ``ic`` (n_ic, 32761, M), ``ec`` (32761, M) and ``iso``
    (n_iso, M), float32, for b-values ``bvals`` (M,) s/mm² and unit ``bvecs`` (M, 3) in the
    streamlines' axes."""
    b = np.asarray(bvals, dtype=np.float64)
    g = np.asarray(bvecs, dtype=np.float64)
    cos2 = (orientation_directions() @ g.T) ** 2  # (32761, M)
    parallel = np.exp(-b * params.d_par * cos2)
    if params.model == "cylinder-zeppelin-ball":
        delta, big = params.small_delta_ms * 1e-3, params.big_delta_ms * 1e-3
        ic = np.stack(
            [
                parallel * np.exp(cylinder_perpendicular_log(b, r * 1e-6, params.d_par, delta, big) * (1.0 - cos2))
                for r in params.radii_um
            ]
        )
    else:
        ic = parallel[None]
    ec = np.exp(-b * (params.d_perp + (params.d_par - params.d_perp) * cos2))
    iso = np.exp(-np.outer(params.d_iso, b))
    return {"ic": ic.astype(np.float32), "ec": ec.astype(np.float32), "iso": iso.astype(np.float32)}


# ------------------------------------------------------------------------------- segments
@dataclass
class Segments:
    """Streamline pieces inside the mask, merged per (streamline, voxel, orientation) and sorted
    by voxel row, then streamline and orientation: ``row`` (mask voxel number) and ``fiber``
    int32, ``length`` (mm) float64, ``orient`` (look-up table index) uint16; the operator's own
    arrays, nothing per streamline."""

    row: np.ndarray
    fiber: np.ndarray
    length: np.ndarray
    orient: np.ndarray
    n_fibers: int
    #: Where each segment sits, listed by streamline (rows ascending within one): what the
    #: device operator's Aᵀ and norms need; known when the segments were built on the device
    #: (no sort of a per-segment key then), None otherwise.
    by_fiber: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.row)

    @property
    def on_device(self) -> bool:
        return array_module(self.row) is not np


def array_module(a):
    """numpy, or cupy for a CuPy array (decided by the array's type: no CuPy import otherwise)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _host(a) -> np.ndarray:
    """A NumPy array of ``a`` (a copy from the device for a CuPy array)."""
    return a.get() if array_module(a) is not np else np.asarray(a)


def _repeat_index(xp, counts):
    """``repeat(arange(len(counts)), counts)`` on any array module."""
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    return xp.searchsorted(ends, xp.arange(total), side="right")


def _chunk_segments(xp, points, offsets, rows_flat, shape, vs, n_rows: int):
    """(fiber, row, orientation, length) of the pieces of streamlines ``offsets`` (local to
    ``points``), merged per (fiber, row, orientation); fibers numbered from 0."""
    n_fibers = len(offsets) - 1
    fiber_of_point = _repeat_index(xp, offsets[1:] - offsets[:-1])
    # Polyline segment k runs from point k to point k + 1 of the same streamline.
    start = xp.flatnonzero(fiber_of_point[1:] == fiber_of_point[:-1])
    p, q = points[start], points[start + 1]
    fib = fiber_of_point[start]
    delta = q - p
    physical = delta * vs
    seg_len = xp.sqrt((physical**2).sum(1))
    keep = xp.flatnonzero(seg_len > 0)
    p, delta, physical, seg_len, fib = p[keep], delta[keep], physical[keep], seg_len[keep], fib[keep]
    q = p + delta
    n = len(p)
    empty = (xp.zeros(0, xp.int64),) * 3 + (xp.zeros(0),)
    if n == 0 or n_fibers == 0:
        return empty
    orient_seg = orientation_index(physical, xp)
    # Crossings of the planes k + 1/2 on each axis, as parameters t in (0, 1).
    cp_, cq_ = xp.floor(p + 0.5), xp.floor(q + 0.5)
    t_parts, id_parts = [xp.zeros(n), xp.ones(n)], [xp.arange(n), xp.arange(n)]
    for axis in range(3):
        lo, hi = xp.minimum(cp_[:, axis], cq_[:, axis]), xp.maximum(cp_[:, axis], cq_[:, axis])
        count = (hi - lo).astype(xp.int64)
        owner = _repeat_index(xp, count)
        if not len(owner):
            continue
        first = xp.cumsum(count) - count
        within = xp.arange(len(owner)) - first[owner]
        plane = lo[owner] + 0.5 + within
        t_parts.append((plane - p[owner, axis]) / delta[owner, axis])
        id_parts.append(owner)
    t = xp.concatenate(t_parts)
    owner = xp.concatenate(id_parts)
    order = xp.lexsort(xp.stack([t, owner.astype(xp.float64)]))
    t, owner = t[order], owner[order]
    same = owner[1:] == owner[:-1]
    t0, t1, k = t[:-1][same], t[1:][same], owner[:-1][same]
    piece = (t1 - t0) * seg_len[k]
    mid = p[k] + ((t0 + t1) / 2)[:, None] * delta[k]
    vox = xp.floor(mid + 0.5).astype(xp.int64)
    inside = ((vox >= 0) & (vox < shape)).all(1)
    flat = (vox[:, 0] * shape[1] + vox[:, 1]) * shape[2] + vox[:, 2]
    row = xp.where(inside, rows_flat[xp.where(inside, flat, 0)], -1)
    ok = xp.flatnonzero((row >= 0) & (piece > 0))
    row, k, piece = row[ok], k[ok], piece[ok]
    fiber, orient = fib[k], orient_seg[k].astype(xp.int64)
    # Merge per (fiber, row, orientation): sum the lengths.
    key = (fiber * max(n_rows, 1) + row) * N_ORIENTATIONS + orient
    unique, inverse = xp.unique(key, return_inverse=True)
    total = xp.bincount(inverse.ravel(), weights=piece, minlength=len(unique))
    return (
        unique // (max(n_rows, 1) * N_ORIENTATIONS),
        (unique // N_ORIENTATIONS) % max(n_rows, 1),
        unique % N_ORIENTATIONS,
        total,
    )


#: Points per chunk when cutting streamlines into segments (bounds the working memory: about
#: 0.6 kB per point at the peak on the host, 1 kB on the device; smaller when the device has
#: less free). The host's chunk is smaller: its working memory adds to the segments kept.
SEGMENT_CHUNK_POINTS = 4_000_000
HOST_SEGMENT_CHUNK_POINTS = 1 << 18
SEGMENT_BYTES_PER_POINT = 1024
#: Host bytes each kept segment costs (row, fiber int32; length float64; orientation uint16).
SEGMENT_BYTES = 4 + 4 + 8 + 2


class NonFinitePoints(ValueError):
    """Streamline points that are NaN or infinite (on the grid), met while cutting segments."""


def _finite(xp, chunk, lo: int):
    if not bool(xp.isfinite(chunk).all()):
        raise NonFinitePoints(f"streamline points from number {lo} on include NaN or infinite coordinates")
    return chunk


def _voxel_points(points, lo: int, hi: int, to_voxel) -> np.ndarray:
    """Points ``lo … hi − 1`` as float64 voxel coordinates (``to_voxel``: a 4×4 affine from the
    points' frame, or None when they are voxel coordinates already); the same arithmetic as
    :meth:`Tractogram.points_on`, one chunk at a time."""
    chunk = np.asarray(points[lo:hi], dtype=np.float64)
    if to_voxel is None:
        return _finite(np, chunk, lo)
    return _finite(np, chunk @ to_voxel[:3, :3].T + to_voxel[:3, 3], lo)


def _compact(xp, host, fiber, row, orient, length, first: int, min_length_mm: float):
    """A chunk's merged pieces of at least ``min_length_mm`` as compact host arrays (fiber
    numbered from ``first``), re-sorted by row where they are (on the device for a GPU), stably:
    the key row · n + position is unique, so any sort keeps the order within a row."""
    keep = xp.flatnonzero(length >= min_length_mm)
    if len(keep):
        keep = keep[xp.argsort(row[keep] * len(keep) + xp.arange(len(keep)))]
    return (
        host((row[keep]).astype(xp.int32)),
        host((fiber[keep] + first).astype(xp.int32)),
        host(length[keep].astype(xp.float64)),
        host(orient[keep].astype(xp.uint16)),
    )


def _empty_segments(counts: np.ndarray, n_fibers: int) -> tuple[Segments, np.ndarray]:
    """Preallocated segments for ``counts`` per row, and where each row's first one goes."""
    total = int(counts.sum())
    out = Segments(
        np.empty(total, np.int32), np.empty(total, np.int32), np.empty(total), np.empty(total, np.uint16), n_fibers
    )
    return out, np.cumsum(counts) - counts


def _scatter_by_row(out: Segments, cursor: np.ndarray, part) -> None:
    """One chunk's segments (ordered by row, then fiber and orientation; chunks come in fiber
    order) into their places in ``out``: a stable counting sort by row, ``cursor`` advanced."""
    row, fiber, length, orient = part
    if not len(row):
        return
    group_start = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    sizes = np.diff(np.r_[group_start, len(row)])
    target = cursor[row] + (np.arange(len(row)) - np.repeat(group_start, sizes))
    cursor[row[group_start]] += sizes
    out.row[target], out.fiber[target], out.length[target], out.orient[target] = row, fiber, length, orient


def segments(
    points: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    voxel_size,
    *,
    min_length_mm: float = 1e-3,
    backend=None,
    chunk_points: int | None = None,
    to_voxel: np.ndarray | None = None,
    two_pass: bool | None = None,
    on_device: bool = False,
) -> Segments:
    """Split streamlines (``points`` (P, 3) in voxel coordinates, voxel centres at integers, or
    in another frame that ``to_voxel`` (4×4) maps to them; streamline i is
    ``points[offsets[i]:offsets[i + 1]]``; any array that slices, e.g. a memory map) exactly at
    voxel boundaries. ``rows``: (X, Y, Z) int, each voxel's row (−1 outside the mask). On
    ``backend`` (a GPU backend: the same array operations in CuPy) when given; streamlines go in
    chunks of about ``chunk_points`` points, and only the compact segments are kept
    (:data:`SEGMENT_BYTES` a segment; no copy of the points). The counting sort by row needs the
    count per row first: ``two_pass`` (default: on a GPU, where cutting is cheap) cuts the
    streamlines twice, counting and then scattering, so the host holds the segments once;
    otherwise the chunks' segments are kept until all are counted (twice the memory a while).
    ``on_device`` (a GPU backend only): the segments stay on the device, nothing per segment
    on the host, and their listing by streamline (:attr:`Segments.by_fiber`) comes with them."""
    xp = np if backend is None or not backend.is_gpu else backend.xp
    if on_device and backend is not None and backend.is_gpu:
        return _device_segments(points, offsets, rows, voxel_size, min_length_mm, backend, chunk_points, to_voxel)
    two_pass = xp is not np if two_pass is None else two_pass
    if chunk_points is None:
        chunk_points = HOST_SEGMENT_CHUNK_POINTS if xp is np else SEGMENT_CHUNK_POINTS
    if xp is not np:  # the working memory must fit in what the device has free
        chunk_points = max(1000, min(chunk_points, backend.free_memory_bytes() // 2 // SEGMENT_BYTES_PER_POINT))
    offsets = np.asarray(offsets, dtype=np.int64)
    to_voxel = None if to_voxel is None else np.asarray(to_voxel, dtype=np.float64)
    n_fibers = len(offsets) - 1
    n_rows = int(rows.max()) + 1 if rows.size else 0
    rows_flat = xp.asarray(np.ascontiguousarray(rows, dtype=np.int64).ravel())
    shape = xp.asarray(np.array(rows.shape, dtype=np.int64))
    vs = xp.asarray(np.asarray(voxel_size, dtype=np.float64))
    host = (lambda a: a) if xp is np else backend.to_host

    def chunks():  # (compact host arrays) of whole streamlines, in fiber order
        nonlocal chunk_points
        first = 0
        while first < n_fibers:
            last = int(np.searchsorted(offsets, offsets[first] + max(chunk_points, 2), side="right")) - 1
            last = min(max(last, first + 1), n_fibers)
            lo, hi = offsets[first], offsets[last]
            try:
                chunk = xp.asarray(_voxel_points(points, lo, hi, to_voxel))
                part = _chunk_segments(
                    xp, chunk, xp.asarray(offsets[first : last + 1] - lo), rows_flat, shape, vs, n_rows
                )
                part = _compact(xp, host, *part, first, min_length_mm)
            except Exception as exc:  # out of device memory: retry with half the points
                if xp is np or not backend.is_out_of_memory(exc) or last - first == 1:
                    raise
                backend.free_cached_memory()
                chunk_points = max(1, (hi - lo) // 2)
                continue
            del chunk
            yield part
            first = last

    counts = np.zeros(n_rows, dtype=np.int64)
    parts = []
    for part in chunks():
        counts += np.bincount(part[0], minlength=n_rows)
        if not two_pass:
            parts.append(part)
        del part
    out, cursor = _empty_segments(counts, n_fibers)
    if two_pass:
        for part in chunks():
            _scatter_by_row(out, cursor, part)
    else:
        parts.reverse()
        while parts:  # each chunk freed once scattered
            _scatter_by_row(out, cursor, parts.pop())
    return out


def _device_voxel_points(xp, points, lo: int, hi: int, to_voxel):
    """Points ``lo … hi − 1`` as float64 voxel coordinates on the device: sent in their own
    precision (float32: a third of the bytes of float64) and transformed there."""
    chunk = xp.asarray(np.ascontiguousarray(points[lo:hi])).astype(xp.float64)
    if to_voxel is None:
        return _finite(xp, chunk, lo)
    m = xp.asarray(to_voxel)
    return _finite(xp, chunk @ m[:3, :3].T + m[:3, 3], lo)


#: Device bytes each segment holds while the device-resident segments are built (the chunks'
#: compact arrays, the row-sorted copy and the listing by streamline)
DEVICE_BUILD_BYTES_PER_SEGMENT = 2 * SEGMENT_BYTES + 8


def _device_segments(points, offsets, rows, voxel_size, min_length_mm, backend, chunk_points, to_voxel) -> Segments:
    """:func:`segments` kept on the device: each chunk's merged pieces (ordered by streamline,
    row, orientation, as ``unique`` gives them) are counted per row; then each chunk is placed
    by a stable counting sort by row, and where each of its segments went is, read in chunk
    order, the listing by streamline (:attr:`Segments.by_fiber`) without a sort of the whole.
    The chunks stay on the device between the two steps when they fit (else they are cut again)."""
    xp = backend.xp
    if chunk_points is None:
        chunk_points = SEGMENT_CHUNK_POINTS
    offsets = np.asarray(offsets, dtype=np.int64)
    to_voxel = None if to_voxel is None else np.asarray(to_voxel, dtype=np.float64)
    n_fibers = len(offsets) - 1
    n_rows = int(rows.max()) + 1 if rows.size else 0
    rows_flat = xp.asarray(np.ascontiguousarray(rows, dtype=np.int64).ravel())
    shape = xp.asarray(np.array(rows.shape, dtype=np.int64))
    vs = xp.asarray(np.asarray(voxel_size, dtype=np.float64))

    def cut(first: int, last: int):
        lo, hi = int(offsets[first]), int(offsets[last])
        chunk = _device_voxel_points(xp, points, lo, hi, to_voxel)
        fiber, row, orient, length = _chunk_segments(
            xp, chunk, xp.asarray(offsets[first : last + 1] - lo), rows_flat, shape, vs, n_rows
        )
        del chunk
        keep = xp.flatnonzero(length >= min_length_mm)
        return (
            row[keep].astype(xp.int32),
            (fiber[keep] + first).astype(xp.int32),
            length[keep],
            orient[keep].astype(xp.uint16),
        )

    def ranges():
        limit = max(1000, min(chunk_points, backend.free_memory_bytes() // 2 // SEGMENT_BYTES_PER_POINT))
        first = 0
        while first < n_fibers:
            last = int(np.searchsorted(offsets, offsets[first] + max(limit, 2), side="right")) - 1
            yield first, min(max(last, first + 1), n_fibers)
            first = min(max(last, first + 1), n_fibers)

    def cut_or_halve(first: int, last: int):
        try:
            part = cut(first, last)
        except Exception as exc:  # out of device memory: this range in two halves, and so on
            if not backend.is_out_of_memory(exc) or last - first == 1:
                raise
            backend.free_cached_memory()
            middle = (first + last) // 2
            yield from cut_or_halve(first, middle)
            yield from cut_or_halve(middle, last)
            return
        yield part

    def parts():
        for first, last in ranges():
            yield from cut_or_halve(first, last)

    counts = xp.zeros(n_rows, dtype=xp.int64)
    kept: list | None = []
    held = 0
    for part in parts():
        counts += xp.bincount(part[0], minlength=n_rows)
        if kept is not None:
            held += len(part[0]) * SEGMENT_BYTES
            if 3 * held > backend.free_memory_bytes():  # keeping them would crowd the rest out: cut again
                kept = None
            else:
                kept.append(part)
        del part
    total = int(counts.sum())
    out = Segments(
        xp.empty(total, xp.int32),
        xp.empty(total, xp.int32),
        xp.empty(total, xp.float64),
        xp.empty(total, xp.uint16),
        n_fibers,
        xp.empty(total, xp.int64),
    )
    cursor = xp.cumsum(counts) - counts
    base = 0
    source = parts() if kept is None else _drain(kept)
    for row, fiber, length, orient in source:
        n = len(row)
        if n:
            # by row; the unique key row · n + position keeps the order within a row (any sort)
            by_row = xp.argsort(row.astype(xp.int64) * n + xp.arange(n))
            row_sorted = row[by_row]
            first = xp.concatenate([xp.ones(1, dtype=bool), row_sorted[1:] != row_sorted[:-1]])
            starts = xp.flatnonzero(first)
            sizes = xp.diff(xp.concatenate([starts, xp.asarray([n])]))
            rank = xp.arange(n) - starts[xp.cumsum(first) - 1]
            target = cursor[row_sorted] + rank
            cursor[row_sorted[starts]] += sizes
            out.row[target], out.fiber[target] = row_sorted, fiber[by_row]
            out.length[target], out.orient[target] = length[by_row], orient[by_row]
            out.by_fiber[base + by_row] = target
        base += n
    return out


def _drain(items: list):
    """Yield and drop the items of ``items`` from the front (each freed once used)."""
    items.reverse()
    while items:
        yield items.pop()


# ------------------------------------------------------------------------------- the problem
@dataclass
class Problem:
    """Everything A is made of (host arrays): segments sorted by row, EC compartments (row,
    orientation; sorted by row), the look-up tables (``lut_ic`` (n_ic, 32761, M)), and column
    scales (A's columns divided by ``scale`` have unit norm; the fit works on those). Columns:
    IC response j of streamline f at ``j · n_fibers + f``, then EC, then ISO (row-major)."""

    n_rows: int
    segments: Segments
    ec_row: np.ndarray
    ec_orient: np.ndarray
    lut_ic: np.ndarray
    lut_ec: np.ndarray
    lut_iso: np.ndarray
    scale: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        if self.lut_ic.ndim == 2:  # one IC response
            self.lut_ic = self.lut_ic[None]
        for rows in (self.segments.row, self.ec_row):
            xp = array_module(rows)
            if len(rows) > 1 and bool(xp.any(rows[1:] < rows[:-1])):
                raise ValueError("segments and EC compartments must be sorted by voxel row")

    @property
    def n_meas(self) -> int:
        return int(self.lut_ic.shape[2])

    @property
    def n_ic(self) -> int:
        return int(self.lut_ic.shape[0])

    @property
    def n_fibers(self) -> int:
        return self.segments.n_fibers

    @property
    def n_ec(self) -> int:
        return len(self.ec_row)

    @property
    def n_iso(self) -> int:
        return int(self.lut_iso.shape[0])

    @property
    def n_cols(self) -> int:
        return self.n_ic * self.n_fibers + self.n_ec + self.n_rows * self.n_iso

    @property
    def n_ic_cols(self) -> int:
        return self.n_ic * self.n_fibers

    def split(self, x: np.ndarray):
        """(IC (n_ic, n_fibers), EC (n_ec,), ISO (n_rows, n_iso)) parts of a column vector."""
        a, b = self.n_ic_cols, self.n_ic_cols + self.n_ec
        return x[:a].reshape(self.n_ic, self.n_fibers), x[a:b], x[b:].reshape(self.n_rows, self.n_iso)


CHUNK = 1 << 18  # segments per step of the NumPy reference and of row-sorted passes (bounded memory)
DEVICE_CHUNK = 1 << 26  # segments per step of row-sorted passes over segments on the device


def ec_compartments(row: np.ndarray, orient: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments (row, orientation), one per distinct pair, sorted by row (as
    :class:`Problem` needs)."""
    key = np.unique(np.asarray(row, dtype=np.int64) * N_ORIENTATIONS + orient)
    return (key // N_ORIENTATIONS).astype(np.int32), (key % N_ORIENTATIONS).astype(np.int32)


def row_chunks(row: np.ndarray, size: int | None = None):
    """Slices of about ``size`` (default :data:`CHUNK`) of row-sorted ``row`` that never split a
    row (``row`` on the host or the device)."""
    size = CHUNK if size is None else size
    xp = array_module(row)
    start, n = 0, len(row)
    while start < n:
        stop = min(start + size, n)
        if stop < n:  # extend to the end of the row it stops in
            stop = int(xp.searchsorted(row, row[stop - 1 : stop], side="right")[0])
        yield slice(start, stop)
        start = stop


def ec_from_segments(seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments where no peaks file is given: one per (voxel, orientation) among the
    segments there (row by row in chunks: no per-segment int64 key of the whole), host arrays.
    Segments on the device are reduced there, in chunks of many rows, and only the distinct
    pairs come to the host."""
    if seg.on_device:
        xp = array_module(seg.row)
        keys = []
        for part in row_chunks(seg.row, DEVICE_CHUNK):
            keys.append(_host(xp.unique(seg.row[part].astype(xp.int64) * N_ORIENTATIONS + seg.orient[part])))
        key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        return (key // N_ORIENTATIONS).astype(np.int32), (key % N_ORIENTATIONS).astype(np.int32)
    pairs = [ec_compartments(seg.row[part], seg.orient[part]) for part in row_chunks(seg.row)]
    if not pairs:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def ic_per_row(seg: Segments, fiber_weight: np.ndarray, n_rows: int) -> np.ndarray:
    """Σ length × weight of the segment's streamline, per voxel row (in chunks of whole rows: the
    same sums, in the same order, as one ``bincount``). Each chunk adds only to its own rows: a
    chunk never splits a row, so every row is one chunk's sum, as when each chunk's ``bincount``
    of all rows was added (0 + s is s), without an ``n_rows`` temporary per chunk."""
    if seg.on_device:
        return _device_ic_per_row(seg, fiber_weight, n_rows)
    out = np.zeros(n_rows)
    for part in row_chunks(seg.row):
        rows = _host(seg.row[part])
        first, last = int(rows[0]), int(rows[-1]) + 1
        weights = _host(seg.length[part]) * fiber_weight[_host(seg.fiber[part])]
        out[first:last] += np.bincount(rows - first, weights=weights, minlength=last - first)
    return out


#: One thread per voxel row adds its segments' length × weight in their order, from 0: the
#: additions ``bincount`` makes, in the same order (the product rounded on its own: no FMA).
_ROW_SUMS = (
    "raw int64 start, raw float64 length, raw int32 fiber, raw float64 weight",
    "float64 out",
    "double s = 0.0; for (long long k = start[i]; k < start[i + 1]; ++k) s += __dmul_rn(length[k], weight[fiber[k]]);"
    " out = s;",
    "tractlens_commit_ic_per_row",
)


def _device_ic_per_row(seg: Segments, fiber_weight: np.ndarray, n_rows: int) -> np.ndarray:
    """:func:`ic_per_row` of segments on the device, computed there, bit for bit the host's."""
    xp = array_module(seg.row)
    start = xp.searchsorted(seg.row, xp.arange(n_rows + 1, dtype=seg.row.dtype)).astype(xp.int64)
    out = xp.empty(n_rows, dtype=xp.float64)
    if n_rows:
        kernel = xp.ElementwiseKernel(*_ROW_SUMS)
        weight = xp.asarray(np.asarray(fiber_weight, dtype=np.float64))
        kernel(start, seg.length, seg.fiber.astype(xp.int32, copy=False), weight, out)
    return _host(out)


def _add_sorted(y: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """y[rows] += values for ``rows`` sorted ascending (summed per row with ``reduceat``, many
    times faster than ``np.add.at``)."""
    if not len(rows):
        return
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    y[rows[starts]] += np.add.reduceat(values, starts, axis=0)


def apply_a_numpy(problem: Problem, x: np.ndarray) -> np.ndarray:
    """y = A x, (n_rows, M) float64 (the reference)."""
    ic, ec, iso = problem.split(np.asarray(x, dtype=np.float64))
    seg = problem.segments
    y = iso @ problem.lut_iso.astype(np.float64)
    _add_sorted(y, problem.ec_row, ec[:, None] * problem.lut_ec[problem.ec_orient])
    for j in range(problem.n_ic):
        weight = seg.length * ic[j, seg.fiber]
        for s in range(0, len(seg), CHUNK):
            part = slice(s, s + CHUNK)
            _add_sorted(y, seg.row[part], weight[part, None] * problem.lut_ic[j, seg.orient[part]])
    return y


def apply_at_numpy(problem: Problem, y: np.ndarray) -> np.ndarray:
    """x = Aᵀ y for y (n_rows, M), float64 (the reference)."""
    y = np.asarray(y, dtype=np.float64).reshape(problem.n_rows, problem.n_meas)
    seg = problem.segments
    dots = np.empty((problem.n_ic, len(seg)))
    for s in range(0, len(seg), CHUNK):
        part = slice(s, s + CHUNK)
        y_rows = y[seg.row[part]]
        for j in range(problem.n_ic):
            dots[j, part] = np.einsum("ij,ij->i", problem.lut_ic[j, seg.orient[part]], y_rows)
    ic = np.concatenate([np.bincount(seg.fiber, weights=seg.length * d, minlength=problem.n_fibers) for d in dots])
    ec = np.einsum("ij,ij->i", problem.lut_ec[problem.ec_orient], y[problem.ec_row])
    iso = y @ problem.lut_iso.T.astype(np.float64)
    return np.concatenate([ic, ec, iso.ravel()])


def sparse_matrix(problem: Problem):
    """A as an explicit SciPy CSR matrix (rows: voxel × measurement), for small problems and tests."""
    from scipy import sparse

    m = problem.n_meas
    seg = problem.segments
    meas = np.arange(m)
    rows, cols, vals = [], [], []
    for j in range(problem.n_ic):
        rows.append((seg.row[:, None] * m + meas).ravel())
        cols.append(np.repeat(j * problem.n_fibers + seg.fiber.astype(np.int64), m))
        vals.append((seg.length[:, None] * problem.lut_ic[j, seg.orient]).ravel())
    rows.append((problem.ec_row[:, None] * m + meas).ravel())
    cols.append(np.repeat(problem.n_ic_cols + np.arange(problem.n_ec), m))
    vals.append(problem.lut_ec[problem.ec_orient].ravel())
    for j in range(problem.n_iso):
        rows.append((np.arange(problem.n_rows)[:, None] * m + meas).ravel())
        cols.append(np.repeat(problem.n_ic_cols + problem.n_ec + np.arange(problem.n_rows) * problem.n_iso + j, m))
        vals.append(np.tile(problem.lut_iso[j], problem.n_rows))
    shape = (problem.n_rows * m, problem.n_cols)
    matrix = sparse.coo_matrix(
        (np.concatenate(vals).astype(np.float64), (np.concatenate(rows), np.concatenate(cols))), shape=shape
    )
    return matrix.tocsr()  # duplicates summed


def column_norms(problem: Problem) -> np.ndarray:
    """‖A e_j‖ for every column (exact: IC columns summed per (streamline, voxel) first)."""
    seg = problem.segments
    ic = np.zeros((problem.n_ic, problem.n_fibers))
    key = seg.fiber.astype(np.int64) * problem.n_rows + seg.row
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    bounds = np.flatnonzero(np.r_[True, key_sorted[1:] != key_sorted[:-1], True])
    for s in range(0, len(bounds) - 1, CHUNK):  # groups of (fiber, voxel)
        b = bounds[s : s + CHUNK + 1]
        members = order[b[0] : b[-1]]
        for j in range(problem.n_ic):
            vectors = seg.length[members, None] * problem.lut_ic[j, seg.orient[members]]
            summed = np.add.reduceat(vectors, b[:-1] - b[0], axis=0)
            np.add.at(ic[j], seg.fiber[members[b[:-1] - b[0]]], (summed**2).sum(1))
    ec = ec_column_norms2(problem)
    iso = np.tile((problem.lut_iso.astype(np.float64) ** 2).sum(1), problem.n_rows)
    return np.sqrt(np.concatenate([ic.ravel(), ec, iso]))


#: Orientations of the EC table squared and summed at a time
EC_NORM_ROWS = 512


def ec_column_norms2(problem: Problem) -> np.ndarray:
    """‖A e_j‖² of the EC columns: each column is its orientation's row of the EC table, so the
    squared norm is that row's, computed once per orientation and looked up (the same sum of
    the same row in the same order as per column, bit for bit; gathering each column's response
    cost n_ec × M float64 of traffic: half a minute for a whole-brain tractogram)."""
    table = np.asarray(problem.lut_ec)
    per_orientation = np.empty(len(table))
    for start in range(0, len(table), EC_NORM_ROWS):  # a few MB of float64 at a time
        per_orientation[start : start + EC_NORM_ROWS] = (
            table[start : start + EC_NORM_ROWS].astype(np.float64) ** 2
        ).sum(1)
    orient = problem.ec_orient
    return per_orientation[orient if isinstance(orient, np.ndarray) else _host(orient)]


# ---------------------------------------------------------------------------------- FISTA
@dataclass
class FitResult:
    """x (A's columns as given, ≥ 0), the iterations run, the objective per iteration, why it
    stopped, and timings."""

    x: np.ndarray
    iterations: int
    objective: list[float]
    stopped: str
    lipschitz: float
    seconds: float


def power_iteration(a, at, n: int, xp=np, iterations: int = 50, seed: int = 0) -> float:
    """Largest eigenvalue of AᵀA (the gradient's Lipschitz constant), with 1 % headroom."""
    v = xp.asarray(np.random.default_rng(seed).random(n))
    v /= xp.linalg.norm(v)
    value = 0.0
    for _ in range(iterations):
        w = at(a(v))
        value = float(xp.linalg.norm(w))
        if value == 0.0:
            return 1.0
        v = w / value
    return value * 1.01


def fista(
    a: Callable,
    at: Callable,
    y,
    n: int,
    *,
    scale=None,
    lambda_: float = 0.0,
    n_penalised: int = 0,
    max_iter: int = 1000,
    tol: float = 1e-3,
    xp=np,
    progress: Callable[[int, int, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> FitResult:
    """min ½‖A x − y‖² + λ Σ_{j < n_penalised} x_j over x ≥ 0 (on the columns divided by
    ``scale``: the returned x is for A itself). ``a``/``at`` apply A and Aᵀ on flat vectors
    of the array module ``xp``. Stops when the objective changes by less than ``tol``
    relatively between iterations (FISTA is not monotone: the change is taken as is)."""
    t0 = time.perf_counter()
    scale = xp.ones(n) if scale is None else xp.asarray(scale)
    inv = xp.where(scale > 0, 1.0 / xp.where(scale > 0, scale, 1.0), 0.0)  # empty columns stay 0

    def a_s(v):
        return a(v * inv)

    def at_s(r):
        return at(r) * inv

    y = xp.asarray(y, dtype=xp.float64).ravel()
    lipschitz = power_iteration(a_s, at_s, n, xp)
    penalty = xp.zeros(n)
    penalty[:n_penalised] = lambda_ / lipschitz
    x = xp.zeros(n)
    z = x.copy()
    ax = xp.zeros_like(y)  # A x and A z are kept, so an iteration costs one A and one Aᵀ
    az = ax.copy()
    t = 1.0
    objective: list[float] = []
    stopped = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        if cancelled is not None and cancelled():
            raise Cancelled()
        x_new = xp.maximum(z - at_s(az - y) / lipschitz - penalty, 0.0)
        ax_new = a_s(x_new)
        residual = ax_new - y
        value = 0.5 * float(residual @ residual) + lambda_ * float(x_new[:n_penalised].sum())
        objective.append(value)
        t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        beta = (t - 1.0) / t_new
        z = x_new + beta * (x_new - x)
        az = ax_new + beta * (ax_new - ax)
        x, ax, t = x_new, ax_new, t_new
        if progress is not None:
            progress(it, max_iter, value)
        if it > 1 and abs(objective[-2] - value) <= tol * max(abs(value), 1e-300):
            stopped = "tolerance"
            break
    return FitResult(x * inv, it, objective, stopped, lipschitz, time.perf_counter() - t0)


# ------------------------------------------------------------------------------ on the GPU
KERNEL_NAMES = ("commit_a", "commit_at_rows", "commit_at_fibers", "commit_ic_norms")


def kernel_defines(n_meas: int, n_ic: int, n_orient: int) -> tuple[tuple[str, int], ...]:
    """What kernels/commit.cu receives at compile time: measurements per lane (up to
    32 · MPL measurements), IC responses per streamline and orientations per look-up table."""
    mpl = max(1, -(-n_meas // 32))
    if mpl > 32:
        raise ValueError(f"{n_meas} measurements: at most 1024 are supported")
    return (("MPL", mpl), ("NIC", int(n_ic)), ("NORIENT", int(n_orient)))


def kernels(problem: Problem) -> tuple:
    """The four kernels of :class:`DeviceOperator` (:data:`KERNEL_NAMES`), compiled for ``problem``."""
    from . import cuda

    defines = kernel_defines(problem.n_meas, problem.n_ic, problem.lut_ic.shape[1])
    return tuple(cuda.function("commit.cu", name, (), defines) for name in KERNEL_NAMES)


class DeviceOperator:
    """A and Aᵀ as CUDA kernels on a :class:`Problem` copied to the device once
    (``gpu/kernels/commit.cu``): segments sorted by voxel row for A·x, a permutation listing
    them by streamline for Aᵀ·y; float64 accumulation, no atomics. Vectors are device arrays:
    x (n_cols,), y flat (n_rows · M,)."""

    BLOCK = 128

    def __init__(self, backend, problem: Problem):
        cp = self.cp = backend.xp
        self.backend, self.problem = backend, problem
        seg = problem.segments
        self._a, self._at_rows, self._at_fibers, self._norms = kernels(problem)

        def starts(keys, n):  # where each of 0..n begins in sorted keys (device arrays)
            return cp.searchsorted(keys, cp.arange(n + 1, dtype=keys.dtype)).astype(cp.int64)

        # The compact host arrays go up as they are and are widened on the device: no host copies
        # (segments built on the device are used where they are).
        row = cp.asarray(seg.row).astype(cp.int32, copy=False)
        fiber = cp.asarray(seg.fiber).astype(cp.int32, copy=False)
        self.row_start = starts(row, problem.n_rows)
        self.ec_start = starts(cp.asarray(problem.ec_row).astype(cp.int32, copy=False), problem.n_rows)
        # Segments listed by streamline, rows ascending within each (the norms kernel groups by row).
        if seg.by_fiber is not None:
            self.order = cp.asarray(seg.by_fiber).astype(cp.int64, copy=False)
        else:
            self.order = cp.argsort(fiber.astype(cp.int64) * max(problem.n_rows, 1) + row).astype(cp.int64)
        self.fiber_start = starts(fiber[self.order], problem.n_fibers)
        self.seg_row, self.seg_fiber = row, fiber
        self.seg_len = cp.asarray(seg.length).astype(cp.float64, copy=False)
        self.seg_orient = cp.asarray(seg.orient).astype(cp.int32)
        self.ec_orient = cp.asarray(problem.ec_orient).astype(cp.int32, copy=False)
        self.luts = tuple(
            cp.asarray(np.ascontiguousarray(t, dtype=np.float32))
            for t in (problem.lut_ic, problem.lut_ec, problem.lut_iso)
        )
        self.seg_value = cp.empty(len(seg) * problem.n_ic, dtype=cp.float64)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self.grid_rows = max(1, min(-(-problem.n_rows * 32 // self.BLOCK), props["multiProcessorCount"] * 64))
        self.grid_fibers = max(1, min(-(-problem.n_fibers // self.BLOCK), props["multiProcessorCount"] * 64))
        self.grid_fibers_warps = max(
            1, min(-(-problem.n_ic_cols * 32 // self.BLOCK), props["multiProcessorCount"] * 64)
        )

    def column_norms(self) -> np.ndarray:
        """:func:`column_norms` with the IC columns computed on the device (host array)."""
        cp, p = self.cp, self.problem
        norm2 = cp.empty(p.n_ic_cols, dtype=cp.float64)
        args = (self.order, self.fiber_start, np.int32(p.n_fibers), np.int32(p.n_meas), self.seg_row, self.seg_len)
        self._norms((self.grid_fibers_warps,), (self.BLOCK,), (*args, self.seg_orient, self.luts[0], norm2))
        ec = ec_column_norms2(p)
        iso = np.tile((p.lut_iso.astype(np.float64) ** 2).sum(1), p.n_rows)
        return np.sqrt(np.concatenate([self.backend.to_host(norm2), ec, iso]))

    def _sizes(self):
        p = self.problem
        return (np.int32(p.n_rows), np.int32(p.n_meas), np.int32(p.n_fibers), np.int32(p.n_ec), np.int32(p.n_iso))

    def a(self, x):
        """A x: flat (n_rows · M,) float64 on the device."""
        cp = self.cp
        x = cp.ascontiguousarray(cp.asarray(x, dtype=cp.float64))
        y = cp.empty(self.problem.n_rows * self.problem.n_meas, dtype=cp.float64)
        args = (x, *self._sizes(), self.row_start, self.seg_fiber, self.seg_len, self.seg_orient)
        self._a((self.grid_rows,), (self.BLOCK,), (*args, self.ec_start, self.ec_orient, *self.luts, y))
        return y

    def at(self, y):
        """Aᵀ y: (n_cols,) float64 on the device."""
        cp = self.cp
        y = cp.ascontiguousarray(cp.asarray(y, dtype=cp.float64).ravel())
        x = cp.empty(self.problem.n_cols, dtype=cp.float64)
        args = (y, *self._sizes(), self.row_start, self.seg_len, self.seg_orient, self.ec_start, self.ec_orient)
        self._at_rows((self.grid_rows,), (self.BLOCK,), (*args, *self.luts, self.seg_value, x))
        args = (self.seg_value, self.order, self.fiber_start, np.int32(self.problem.n_fibers), x)
        self._at_fibers((self.grid_fibers,), (self.BLOCK,), args)
        return x


# ------------------------------------------------------------- problems larger than the device
#: Device bytes per segment while a :class:`DeviceOperator` exists and is being built (its
#: arrays, the per-segment values and the sort's temporaries), for planning blocks.
DEVICE_BYTES_PER_SEGMENT = 96
#: What a :class:`DeviceOperator` adds per segment to segments already on the device with their
#: listing by streamline (per-segment values, orientations widened, a gathered streamline index)
RESIDENT_EXTRA_BYTES_PER_SEGMENT = 24


def row_blocks(problem: Problem, max_segments: int) -> list[tuple[int, int]]:
    """Contiguous voxel-row ranges holding at most ``max_segments`` segments each (a row with
    more is a block of its own)."""
    row = problem.segments.row
    xp = array_module(row)
    starts = _host(xp.searchsorted(row, xp.arange(problem.n_rows + 1, dtype=row.dtype)))
    blocks, r0 = [], 0
    while r0 < problem.n_rows:
        r1 = int(np.searchsorted(starts, starts[r0] + max(1, max_segments), side="right")) - 1
        r1 = min(max(r1, r0 + 1), problem.n_rows)
        blocks.append((r0, r1))
        r0 = r1
    return blocks


def sub_problem(problem: Problem, r0: int, r1: int) -> tuple[Problem, int, int]:
    """The rows ``r0 … r1 − 1`` of A as a problem of their own (all streamlines' IC columns, the
    EC and ISO columns of those rows), and the range of its EC compartments in the whole."""
    seg = problem.segments
    xp = array_module(seg.row)
    s0, s1 = (int(v) for v in _host(xp.searchsorted(seg.row, xp.asarray([r0, r1], dtype=seg.row.dtype))))
    e0, e1 = (int(v) for v in np.searchsorted(problem.ec_row, [r0, r1]))
    part = Segments(
        (seg.row[s0:s1] - r0).astype(np.int32), seg.fiber[s0:s1], seg.length[s0:s1], seg.orient[s0:s1], seg.n_fibers
    )
    sub = Problem(
        r1 - r0,
        part,
        (problem.ec_row[e0:e1] - r0).astype(np.int32),
        problem.ec_orient[e0:e1],
        problem.lut_ic,
        problem.lut_ec,
        problem.lut_iso,
    )
    return sub, e0, e1


class BlockedOperator:
    """A and Aᵀ in blocks of voxel rows, for problems whose segments do not fit on the device
    at once: each product builds one block's operator (``make(sub_problem)``, e.g. a
    :class:`DeviceOperator`), applies it and frees it before the next. A·x fills each block's
    rows; Aᵀ·y adds each block's part of the streamline columns (a streamline's voxels may lie
    in several blocks) and sets its EC and ISO columns. Slower than one resident operator (the
    segments cross the bus twice per FISTA iteration) but bounded in device memory. A block
    that still runs out of memory (``is_oom``) halves the block size and the product restarts."""

    def __init__(
        self,
        problem: Problem,
        make: Callable[[Problem], object],
        max_segments: int,
        xp=np,
        is_oom: Callable[[BaseException], bool] | None = None,
        free_cache: Callable[[], None] | None = None,
    ):
        self.problem, self.make, self.xp = problem, make, xp
        self.is_oom = is_oom or (lambda exc: isinstance(exc, MemoryError))
        self.free_cache = free_cache or (lambda: None)
        self._split(max_segments)

    def _split(self, max_segments: int) -> None:
        self.max_segments = max(1, int(max_segments))
        self.blocks = [
            (r0, r1, *sub_problem(self.problem, r0, r1)) for r0, r1 in row_blocks(self.problem, max_segments)
        ]

    def _retrying(self, product):
        while True:
            try:
                return product()
            except Exception as exc:
                if not self.is_oom(exc) or self.max_segments == 1:
                    raise
                self.free_cache()
                self._split(self.max_segments // 2)

    def __len__(self) -> int:
        return len(self.blocks)

    def _columns(self, r0: int, r1: int, e0: int, e1: int) -> tuple[slice, slice]:
        p = self.problem
        ec = slice(p.n_ic_cols + e0, p.n_ic_cols + e1)
        iso0 = p.n_ic_cols + p.n_ec
        return ec, slice(iso0 + r0 * p.n_iso, iso0 + r1 * p.n_iso)

    def a(self, x):
        return self._retrying(lambda: self._a(x))

    def at(self, y):
        return self._retrying(lambda: self._at(y))

    def column_norms(self) -> np.ndarray:
        """Column norms (host) from the blocks' operators: squared norms add over voxel rows."""
        return self._retrying(self._column_norms)

    def _a(self, x):
        xp, p = self.xp, self.problem
        x = xp.asarray(x, dtype=xp.float64).ravel()
        y = xp.empty(p.n_rows * p.n_meas)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            op = self.make(sub)
            y[r0 * p.n_meas : r1 * p.n_meas] = xp.ravel(op.a(xp.concatenate([x[: p.n_ic_cols], x[ec], x[iso]])))
            del op
        return y

    def _at(self, y):
        xp, p = self.xp, self.problem
        y = xp.asarray(y, dtype=xp.float64).ravel()
        x = xp.zeros(p.n_cols)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            op = self.make(sub)
            part = op.at(y[r0 * p.n_meas : r1 * p.n_meas])
            x[: p.n_ic_cols] += part[: p.n_ic_cols]
            x[ec] = part[p.n_ic_cols : p.n_ic_cols + sub.n_ec]
            x[iso] = part[p.n_ic_cols + sub.n_ec :]
            del op
        return x

    def _column_norms(self) -> np.ndarray:
        p = self.problem
        out = np.zeros(p.n_cols)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            part = np.asarray(self.make(sub).column_norms()) ** 2
            out[: p.n_ic_cols] += part[: p.n_ic_cols]
            out[ec] = part[p.n_ic_cols : p.n_ic_cols + sub.n_ec]
            out[iso] = part[p.n_ic_cols + sub.n_ec :]
        return np.sqrt(out)


class NumpyOperator:
    """The NumPy reference with the operator interface (flat vectors)."""

    def __init__(self, problem: Problem):
        self.problem = problem

    def a(self, x):
        return apply_a_numpy(self.problem, x).ravel()

    def at(self, y):
        return apply_at_numpy(self.problem, y)

    def column_norms(self) -> np.ndarray:
        return column_norms(self.problem)


def fista_bytes(problem: Problem) -> int:
    """Device bytes FISTA keeps besides the operator: about 16 vectors of the columns (x, z,
    their updates, scales, gradient) and 6 of the measurements (y, A x, A z, residuals), float64."""
    return 8 * (16 * problem.n_cols + 6 * problem.n_rows * problem.n_meas)


def device_operator(backend, problem: Problem, *, max_segments: int | None = None, notes: list | None = None):
    """The operator for ``problem`` on ``backend``: one resident :class:`DeviceOperator` when it
    fits in the free device memory next to FISTA's vectors, else (or when ``max_segments`` says
    so) a :class:`BlockedOperator` of device operators over blocks sized to what is left; a note
    says so. Out of device memory while building the resident one also falls back to blocks."""
    n_seg = max(1, len(problem.segments))
    per_segment = DEVICE_BYTES_PER_SEGMENT * problem.n_ic
    if problem.segments.on_device and problem.segments.by_fiber is not None:
        per_segment = RESIDENT_EXTRA_BYTES_PER_SEGMENT * problem.n_ic  # the segments are there already

    def budget() -> int:  # segments that fit in half of what FISTA leaves free
        return max(1, (backend.free_memory_bytes() - fista_bytes(problem)) // 2 // per_segment)

    if max_segments is None and n_seg <= budget():
        try:
            return DeviceOperator(backend, problem)
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
    op = BlockedOperator(
        problem,
        lambda sub: DeviceOperator(backend, sub),
        max_segments or budget(),
        backend.xp,
        is_oom=backend.is_out_of_memory,
        free_cache=backend.free_cached_memory,
    )
    if notes is not None:
        notes.append(
            f"the problem ({n_seg:,} segments) does not fit in the device's free memory at once: "
            f"A and Aᵀ run in {len(op)} blocks of voxel rows, re-sent each iteration (slower)"
        )
    return op
