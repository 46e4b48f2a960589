"""Geodesic ray tracing in the metric of the inverse diffusion tensor (Sepasian et al. 2012,
"A ray tracing method for geodesic based tractography in diffusion tensor images"; the
metric adapted as in Fuster et al., "A novel Riemannian metric for geodesic tractography
in DTI"; the connectivity measure of Astola, Florack & ter Haar Romeny 2007).

Coordinates are millimetres along the voxel axes (``x_mm = x_voxel · voxel_size``),
so the tensor (in the voxel-axis frame, mm²/s) is the metric's inverse as it is.

Pre-processing, per voxel, in this order (:func:`gpu.geodesic_field.prepare_metric`; every voxel takes exactly
one branch of step 3):

1. ``B = A · gain`` (default gain: 1 / mean diffusivity of the tensors given, so MD ≈ 1);
2. ``B`` singular or not positive definite (Sylvester) → identity, counted. Voxels with
   an all-zero tensor (outside the fitted region) become identity too but are not
   counted as repaired;
3. ``FA(B) < sharpen_fa`` → ``C = B^p`` (integer power ``sharpen_power``), else ``C = B``;
4. the metric (``metric``, :mod:`gpu.geodesic_metrics`): ``G = C⁻¹`` (``inverse``),
   ``G = adj(C) = det(C)·C⁻¹`` (``adjugate``) or ``G = e^{2φ} C⁻¹`` with the adaptive
   conformal factor ``φ`` (``adaptive``, the default), times ``det(C)^k`` more with
   ``conformal_power`` k (determinants relative to their median); the tracker is given
   ``G⁻¹`` and the derivatives of ``G``, whichever metric it is.

Derivatives of ``G`` per axis in mm: central differences inside, one-sided on the
borders. The field holds 24 values per voxel — ``C`` and ``∂G/∂x``, ``∂G/∂y``,
``∂G/∂z`` — interpolated trilinearly at every evaluation, which gives the
geodesic acceleration without forming the 18 Christoffel symbols explicitly. The
derivatives are stored at float16 precision (scaled by a power of two so that their
largest magnitude is near 2¹⁵; relative rounding 2⁻¹¹ ≈ 5·10⁻⁴, far below both the
error of the central differences and the noise of a measured tensor). Both engines
read these same rounded values; they halve what the GPU kernel moves per voxel. ``C``
stays float32:

    ẍ = −Γ(ẋ, ẋ) = −C (w − q/2),  w = (Σ_α ẋ_α ∂_αG) ẋ,  q_σ = ẋᵀ (∂_σG) ẋ

(the same sum as Γ^γ_αβ = ½ Σ_σ C_γσ (∂_αG_βσ + ∂_βG_ασ − ∂_σG_αβ), regrouped).

Integrators on the state (x, ẋ): Euler (one evaluation per step), RK2 (explicit
midpoint: two) and RK4 (four). The velocity starts at unit Euclidean length; with
``normalize`` (default) it is scaled back to unit length after every step. The
geodesic equation is homogeneous in ẋ, so this only re-parametrises the curve: it
keeps the path and makes every step ``step`` long, so ``max_steps`` bounds the length.

Connectivity measure (Astola): ``CM = Σ|Δx| / Σ sqrt(Δxᵀ G(x̄) Δx)`` accumulated
along the fibre, ``G(x̄)`` the inverse of ``C`` interpolated at ``x̄ = x + h/2 · ẋ``,
the point where RK2 and RK4 evaluate their second stage (so it costs them no extra
lookup; Euler looks it up) — the midpoint of the step to second order; stored per
point and per fibre (at its end, or where it first enters the target region).

Stopping, checked in this order each step: the step count reaches ``max_steps``;
the point's FA (of the interpolated ``C``) is below ``fa_threshold``; the new point
leaves the volume or the mask (not taken); the new segment turns more than
``max_angle_deg`` from the previous one (not taken); the length reaches
``max_length_mm``; the point enters the target (``stop_at_target``). Each optional
rule is off at 0.

Engines: array operations over all live fibres (NumPy in float64, the reference;
also runs on CuPy) and the CUDA kernel ``kernels/geodesic.cu`` (float32, one
thread per fibre), the GPU default.

This module traces (:func:`track`, :func:`track_all`); the parameters are in
:mod:`gpu.geodesic_params`, the metric field in :mod:`gpu.geodesic_field`, the metrics in
:mod:`gpu.geodesic_metrics`, two-point shooting in :mod:`gpu.geodesic_shooting` and the
distance method in :mod:`gpu.geodesic_eikonal`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from . import cuda, sym3
from .backend import Backend, get_backend, iter_batched
from .engines import ARRAYS, KERNEL, choose_engine
from .geodesic_field import PACKED_CHUNKS, TARGET, TRACK, GeodesicField, packed_field
from .geodesic_params import INTEGRATORS, GeodesicParams
from .indices import flatnonzero
from .interpolate import inside_volume, lookup, trilinear
from .streamlines import (
    LOW_FA,
    MAX_LENGTH,
    MAX_STEPS,
    OUTSIDE_MASK,
    OUTSIDE_VOLUME,
    REACHED_TARGET,
    SHARP_ANGLE,
    pack_rows,
    stop_code_defines,
)

STOP_NAMES = {MAX_STEPS: "max steps", REACHED_TARGET: "reached the target"}  # the codes only geodesic uses
STOP_CODE_SLOTS = 16  # length of the per-code counts (the codes are small integers)
#: What kernels/geodesic.cu receives at compile time.
KERNEL_DEFINES = (
    *stop_code_defines(
        "MAX_LENGTH", "OUTSIDE_VOLUME", "OUTSIDE_MASK", "LOW_FA", "SHARP_ANGLE", "MAX_STEPS", "REACHED_TARGET"
    ),
    ("TRACK_BIT", TRACK),
    ("TARGET_BIT", TARGET),
    ("CHUNKS", PACKED_CHUNKS),
    ("TOLERANCE_SLACK_MICROSTEPS", 1000),
)
#: A run outside the mask ends a fibre when it exceeds the tolerance by more than this many
#: steps: a tolerance that is a whole number of steps (3 mm of 0.25 mm steps) is then met by
#: both engines alike, instead of float32 and float64 rounding of the summed segments deciding.
TOLERANCE_SLACK = dict(KERNEL_DEFINES)["TOLERANCE_SLACK_MICROSTEPS"] * 1e-6


# ------------------------------------------------------------------------------- directions
def fibonacci_directions(n: int) -> np.ndarray:
    """``n`` nearly uniform unit vectors on the whole sphere (Fibonacci lattice)."""
    if n < 1:
        raise ValueError("at least one direction is needed")
    i = np.arange(n) + 0.5
    z = 1.0 - 2.0 * i / n
    phi = math.pi * (1.0 + math.sqrt(5.0)) * i
    r = np.sqrt(np.clip(1.0 - z * z, 0.0, None))
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)


def cone_directions(axes: np.ndarray, n: int, half_angle_deg: float) -> np.ndarray:
    """``n`` directions per axis (``(P, 3)`` unit): half in a cone of ``half_angle_deg`` around
    +axis, half around −axis (an eigenvector has no sign). Returns ``(P, n, 3)``."""
    if not 0 < half_angle_deg <= 90:
        raise ValueError(f"the cone half-angle must be in (0, 90] degrees, got {half_angle_deg}")
    if n < 2:
        raise ValueError("a cone needs at least two directions (one each way)")
    half = (n + 1) // 2  # an odd n gives +axis the extra one
    i = np.arange(half) + 0.5
    cos_max = math.cos(math.radians(half_angle_deg))
    z = 1.0 - (1.0 - cos_max) * i / half  # uniform in solid angle over the cap
    phi = math.pi * (1.0 + math.sqrt(5.0)) * i
    r = np.sqrt(np.clip(1.0 - z * z, 0.0, None))
    cap = np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)  # around +z
    cap = np.concatenate([cap, -cap[: n // 2]])
    axes = np.asarray(axes, np.float64)
    axes = axes / np.linalg.norm(axes, axis=1, keepdims=True)
    helper = np.where(np.abs(axes[:, :1]) < 0.9, np.array([[1.0, 0, 0]]), np.array([[0, 1.0, 0]]))
    u = np.cross(axes, helper)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    w = np.cross(axes, u)
    return cap[None, :, 0:1] * u[:, None] + cap[None, :, 1:2] * w[:, None] + cap[None, :, 2:3] * axes[:, None]


# ------------------------------------------------------------------------------- arrays engine
def _acceleration(xp, field, x_vox, v):
    """ẍ at voxel positions ``x_vox`` for velocities ``v`` (mm), with C there."""
    s = trilinear(xp, field, x_vox)
    c = s[:, :6]
    m = [s[:, 6 * (k + 1) : 6 * (k + 2)] for k in range(3)]
    vt = tuple(v.T)
    # w = (Σ_α v_α M_α) v ; q_σ = vᵀ M_σ v
    mv = [xp.stack(sym3._apply(sym3.components(mk), vt), -1) for mk in m]
    w = v[:, 0:1] * mv[0] + v[:, 1:2] * mv[1] + v[:, 2:3] * mv[2]
    q = xp.stack([xp.sum(mv[k] * v, axis=1) for k in range(3)], -1)
    r = w - 0.5 * q
    acc = -xp.stack(sym3._apply(sym3.components(c), tuple(r.T)), -1)
    return acc, c


def _unit(xp, v):
    norm = xp.sqrt(xp.sum(v * v, axis=1, keepdims=True))
    return v / xp.where(norm > 0, norm, 1.0)


def _track_arrays(xp, fld: GeodesicField, field, region, starts, directions, params: GeodesicParams):
    n, s_max = len(starts), params.stored_points
    shape = region.shape
    scale = xp.asarray(fld.voxel_size)
    h = params.step * float(fld.voxel_size.min())
    points = xp.zeros((n, s_max, 3), np.float32)
    cms = xp.zeros((n, s_max), np.float32)
    stored = xp.ones(n, np.int64)
    stop = xp.zeros(n, np.uint8)
    reached = xp.full(n, -1, np.int64)
    cm_target = xp.full(n, np.nan, np.float32)
    x = xp.asarray(starts, np.float64) * scale  # mm
    v = _unit(xp, xp.asarray(directions, np.float64))
    points[:, 0] = x / scale
    inside = inside_volume(xp, x / scale, shape)
    code = lookup(xp, region, x / scale)
    stop[~inside] = OUTSIDE_VOLUME
    stop[inside & (code & TRACK == 0)] = OUTSIDE_MASK
    valid = inside & (code & TRACK != 0)
    euclid = xp.zeros(n)
    geo = xp.zeros(n)
    outside = xp.zeros(n)  # distance run since the last point inside the mask (mm)
    excursion = xp.zeros(n)  # the longest run outside the mask that came back inside
    tolerance = float(params.mask_tolerance_mm)
    prev = v.copy()
    steps = xp.zeros(n, np.int64)
    cos_max = math.cos(math.radians(params.max_angle_deg)) if params.max_angle_deg > 0 else -2.0
    idx = flatnonzero(xp, valid)
    k = int(params.store_every)

    def drop(failed, reason):
        nonlocal idx
        stop[idx[failed]] = reason
        return ~failed

    while len(idx):
        xi, vi = x[idx], v[idx]
        live = drop(steps[idx] >= params.max_steps, MAX_STEPS)
        a1, c1 = _acceleration(xp, field, xi / scale, vi)
        if params.fa_threshold > 0:
            live &= drop(live & (sym3.fractional_anisotropy_from_invariants(xp, c1) < params.fa_threshold), LOW_FA)
        idx, xi, vi, a1 = idx[live], xi[live], vi[live], a1[live]
        if params.integrator == "euler":
            x_new, v_new = xi + h * vi, vi + h * a1
            c_mid = None  # looked up below, for the steps taken
        elif params.integrator == "rk2":
            xm, vm = xi + 0.5 * h * vi, vi + 0.5 * h * a1
            a2, c_mid = _acceleration(xp, field, xm / scale, vm)
            x_new, v_new = xi + h * vm, vi + h * a2
        else:
            k1x, k1v = vi, a1
            k2x = vi + 0.5 * h * k1v
            k2v, c_mid = _acceleration(xp, field, (xi + 0.5 * h * k1x) / scale, k2x)
            k3x = vi + 0.5 * h * k2v
            k3v, _ = _acceleration(xp, field, (xi + 0.5 * h * k2x) / scale, k3x)
            k4x = vi + h * k3v
            k4v, _ = _acceleration(xp, field, (xi + h * k3x) / scale, k4x)
            x_new = xi + h / 6.0 * (k1x + 2 * k2x + 2 * k3x + k4x)
            v_new = vi + h / 6.0 * (k1v + 2 * k2v + 2 * k3v + k4v)
        if params.normalize:
            v_new = _unit(xp, v_new)
        q_vox = x_new / scale
        ins = inside_volume(xp, q_vox, shape)
        code = lookup(xp, region, q_vox)
        dx = x_new - xi
        seg = xp.sqrt(xp.sum(dx * dx, axis=1))
        out_mask = (code & TRACK) == 0
        run_out = xp.where(out_mask, outside[idx] + seg, 0.0)
        live = drop(~ins, OUTSIDE_VOLUME)
        live &= drop(live & out_mask & ((run_out > tolerance + TOLERANCE_SLACK * h) | (tolerance <= 0)), OUTSIDE_MASK)
        turn = xp.sum(dx * prev[idx], axis=1) / xp.where(seg > 0, seg, 1.0)
        live &= drop(live & (turn < cos_max), SHARP_ANGLE)
        vi = vi[live]
        if c_mid is None:
            c_mid = trilinear(xp, field[..., :6], (xi[live] + 0.5 * h * vi) / scale)
        else:
            c_mid = c_mid[live]
        idx, xi, x_new, v_new, dx, seg, code = (t[live] for t in (idx, xi, x_new, v_new, dx, seg, code))
        run_out = run_out[live]
        back = (run_out == 0) & (outside[idx] > 0)  # came back inside: the excursion is over
        excursion[idx[back]] = xp.maximum(excursion[idx[back]], outside[idx[back]])
        outside[idx] = run_out
        g_mid = sym3.inverse(xp, c_mid)
        gdx = xp.stack(sym3._apply(sym3.components(g_mid), tuple(dx.T)), -1)
        euclid[idx] += seg
        geo[idx] += xp.sqrt(xp.clip(xp.sum(dx * gdx, axis=1), 0.0, None))
        cm = euclid[idx] / xp.where(geo[idx] > 0, geo[idx], 1.0)
        x[idx], v[idx], prev[idx] = x_new, v_new, dx / xp.where(seg > 0, seg, 1.0)[:, None]
        steps[idx] += 1
        first = steps[idx] == 1
        cms[idx[first], 0] = cm[first]
        keep = steps[idx] % k == 0
        slot = stored[idx]
        points[idx[keep], slot[keep]] = (x_new / scale)[keep]
        cms[idx[keep], slot[keep]] = cm[keep]
        stored[idx[keep]] += 1
        hit = ((code & TARGET) != 0) & (reached[idx] < 0)
        reached[idx[hit]] = steps[idx[hit]]
        cm_target[idx[hit]] = cm[hit]
        # The last point is always kept: write it (once more) at the next free slot when it was not.
        live = xp.ones(len(idx), bool)
        if params.max_length_mm > 0:
            live &= drop(euclid[idx] >= params.max_length_mm, MAX_LENGTH)
        if params.stop_at_target:
            live &= drop(live & hit, REACHED_TARGET)
        ended = ~live & ~keep
        points[idx[ended], stored[idx[ended]]] = (x_new / scale)[ended]
        cms[idx[ended], stored[idx[ended]]] = cm[ended]
        stored[idx[ended]] += 1
        idx = idx[live]
    # Fibres stopped before taking their last step unstored: add their current point.
    missing = valid & (steps % k != 0) & ~_ended_with_store(stop, params)
    points[missing, stored[missing]] = (x[missing] / scale).astype(np.float32)
    cms[missing, stored[missing]] = (euclid[missing] / xp.where(geo[missing] > 0, geo[missing], 1.0)).astype(np.float32)
    stored[missing] += 1
    cm_end = cms[xp.arange(n), stored - 1]
    return points, cms, stored, stop, valid, steps, reached, cm_target, cm_end, excursion.astype(np.float32)


def _ended_with_store(stop, params):
    """Stops whose final point was written when they happened (length, target)."""
    return (stop == MAX_LENGTH) | (stop == REACHED_TARGET)


# ------------------------------------------------------------------------------- driver
@dataclass
class GeodesicBatch:
    """Fibres of one batch (voxel coordinates): ``points``/``offsets`` ragged, ``cm`` per point,
    ``fiber`` (index into the starts × directions list), ``cm_end``, ``reached`` (step at
    which the target was first entered, −1 never), ``cm_target``, ``stop`` reason, ``steps``,
    ``excursion`` (mm: the longest run outside the mask the fibre came back from, 0 none).
    ``provenance["stop_counts"]`` counts the stop codes of every fibre traced, kept or not."""

    points: np.ndarray
    offsets: np.ndarray
    cm: np.ndarray
    fiber: np.ndarray
    cm_end: np.ndarray
    reached: np.ndarray
    cm_target: np.ndarray
    stop: np.ndarray
    steps: np.ndarray
    excursion: np.ndarray
    provenance: dict = field(default_factory=dict)

    FIBRE_FIELDS = ("fiber", "cm_end", "reached", "cm_target", "stop", "steps", "excursion")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def concatenate(cls, batches) -> GeodesicBatch:
        batches = list(batches)
        starts = np.cumsum([0] + [len(b.points) for b in batches[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [b.offsets[1:] + s for b, s in zip(batches, starts)])
        cat = {
            name: np.concatenate([getattr(b, name) for b in batches]) for name in ("points", "cm", *cls.FIBRE_FIELDS)
        }
        return cls(offsets=offsets, **cat)


def _compact(xp, out, fiber_offset: int, only_reaching: bool) -> GeodesicBatch:
    points, cms, stored, stop, valid, steps, reached, cm_target, cm_end, excursion = out
    keep = valid & (stored >= 2)
    if only_reaching:
        keep &= reached >= 0
    kept = flatnonzero(xp, keep)
    counts = stored[kept]
    first = xp.zeros(len(kept), np.int64)
    packed, offsets = pack_rows(xp, points, kept, first, counts)
    cm_packed, _ = pack_rows(xp, cms, kept, first, counts)
    host = xp.asnumpy if xp is not np else np.asarray
    return GeodesicBatch(
        host(packed),
        host(offsets),
        host(cm_packed),
        host(kept) + fiber_offset,
        host(cm_end[kept]),
        host(reached[kept]),
        host(cm_target[kept]),
        host(stop[kept]),
        host(steps[kept]),
        host(excursion[kept]),
    )


def batch_bytes(params: GeodesicParams) -> int:
    return params.stored_points * (12 + 4) * 3 + 512


def track(
    fld: GeodesicField,
    starts: np.ndarray,
    directions: np.ndarray,
    params: GeodesicParams = GeodesicParams(),
    *,
    only_reaching: bool = False,
    device: str | Backend = "auto",
    engine: str = "auto",
    max_batch: int | None = None,
    first_batch: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[GeodesicBatch]:
    """Trace one fibre per row of ``starts`` (voxel coordinates) and ``directions``, in batches.

    With ``only_reaching`` only fibres that entered the target come back. ``first_batch``
    caps the first batch, for a quick first look (live re-tracking).
    """
    backend = get_backend(device)
    xp = backend.xp
    engine = choose_engine(engine, backend, available=(KERNEL, ARRAYS), method="geodesic tracking")
    starts = np.asarray(starts, np.float64).reshape(-1, 3)
    directions = np.asarray(directions, np.float64).reshape(-1, 3)
    if len(starts) != len(directions):
        raise ValueError(f"{len(starts)} start points but {len(directions)} directions")
    field_dev = packed_field(backend, fld) if engine == "kernel" else backend.asarray(fld.data)
    region = backend.asarray(fld.region)
    if max_batch is None and not backend.is_gpu:
        max_batch = 4096

    def work(a: int, b: int) -> GeodesicBatch:
        t0 = time.perf_counter()
        s, d = backend.asarray(starts[a:b]), backend.asarray(directions[a:b])
        if engine == "kernel":
            out = _track_kernel(backend, fld, field_dev, region, s, d, params)
        else:
            out = _track_arrays(xp, fld, field_dev.astype(np.float64), region, s, d, params)
        batch = _compact(xp, out, a, only_reaching)
        steps = int(out[5].sum())
        stop_counts = backend.to_host(xp.bincount(out[3].astype(xp.int64), minlength=STOP_CODE_SLOTS))
        excursions = out[9][out[9] > 0]
        backend.synchronize()
        batch.provenance = {
            "fibers": b - a, "kept": len(batch), "steps": steps, "seconds": time.perf_counter() - t0,
            "stop_counts": stop_counts, "excursions": int(excursions.size),
            "longest_excursion_mm": float(excursions.max()) if int(excursions.size) else 0.0,
        }  # fmt: skip
        return batch

    yield from iter_batched(
        backend, len(starts), batch_bytes(params), work, progress=progress, cancelled=cancelled, fraction=0.4,
        maximum=max_batch, first=first_batch,
    )  # fmt: skip


def track_all(fld, starts, directions, params: GeodesicParams = GeodesicParams(), **kwargs) -> GeodesicBatch:
    backend = get_backend(kwargs.pop("device", "auto"))
    t0 = time.perf_counter()
    batches = list(track(fld, starts, directions, params, device=backend, **kwargs))
    out = GeodesicBatch.concatenate(batches)
    seconds = time.perf_counter() - t0
    steps = sum(b.provenance["steps"] for b in batches)
    out.provenance = {
        "method": "geodesic",
        "parameters": asdict(params),
        "backend": backend.name,
        "device": backend.device_name,
        "fibers": len(starts),
        "kept": len(out),
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds if seconds > 0 else None,
        **ending_totals(batches),
    }
    return out


def ending_totals(batches) -> dict:
    """How the fibres of a run ended, over every batch: ``stop_counts`` (per stop code, every
    fibre traced, kept or not), ``excursions`` (fibres that left the mask and came back) and
    ``longest_excursion_mm``."""
    counts = np.zeros(STOP_CODE_SLOTS, np.int64)
    for b in batches:
        counts += np.asarray(b.provenance.get("stop_counts", 0))
    return {
        "stop_counts": counts,
        "excursions": sum(int(b.provenance.get("excursions", 0)) for b in batches),
        "longest_excursion_mm": max([float(b.provenance.get("longest_excursion_mm", 0.0)) for b in batches] + [0.0]),
    }


def top_fraction(cm: np.ndarray, percent: float, xp=np) -> np.ndarray:
    """Indices of the ``percent`` % of fibres with the highest CM, best first."""
    if not 0 < percent <= 100:
        raise ValueError(f"the top percentage must be in (0, 100], got {percent}")
    cm = xp.asarray(cm)
    count = math.ceil(len(cm) * percent / 100.0)
    order = xp.argsort(-cm, kind="stable")
    return order[:count]


KERNEL_BLOCK = 32  # threads per block: small blocks pack the shared-memory cell caches tightly
CELL_CACHE_BYTES = 8 * 16 * PACKED_CHUNKS  # per thread: the 8 voxels of its cell


def _kernel():
    return cuda.function("geodesic.cu", "geodesic_trace", ("sym3.cuh", "tracking.cuh"), KERNEL_DEFINES)


def _track_kernel(backend, fld, field_dev, region, starts, directions, params: GeodesicParams):
    """Run the CUDA kernel on fibres ``starts``/``directions`` (device arrays); ``field_dev``
    is ``packed_field``'s array."""
    cp = backend.xp
    n, slots = len(starts), params.stored_points
    points = cp.empty((n, slots, 3), cp.float32)
    cms = cp.empty((n, slots), cp.float32)
    out = {
        "stored": cp.empty(n, cp.int64),
        "stop": cp.empty(n, cp.uint8),
        "valid": cp.empty(n, cp.uint8),
        "steps": cp.empty(n, cp.int64),
        "reached": cp.empty(n, cp.int64),
        "cm_target": cp.empty(n, cp.float32),
        "cm_end": cp.empty(n, cp.float32),
        "excursion": cp.empty(n, cp.float32),
    }
    cos_max = math.cos(math.radians(params.max_angle_deg)) if params.max_angle_deg > 0 else -2.0
    vs = fld.voxel_size
    counter = cp.zeros(1, cp.int32)
    kernel = _kernel()
    # Persistent threads: enough blocks to fill every multiprocessor (the extra ones find
    # no work left and return at once).
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    blocks = max(1, min((n + KERNEL_BLOCK - 1) // KERNEL_BLOCK, sms * 32))
    kernel(
        (blocks,),
        (KERNEL_BLOCK,),
        (
            field_dev,
            region,
            np.int32(fld.shape[0]),
            np.int32(fld.shape[1]),
            np.int32(fld.shape[2]),
            cp.ascontiguousarray(starts, dtype=cp.float32),
            cp.ascontiguousarray(directions, dtype=cp.float32),
            np.int32(n),
            np.float32(vs[0]),
            np.float32(vs[1]),
            np.float32(vs[2]),
            np.float32(1.0 / fld.derivative_scale),
            np.float32(params.step * float(vs.min())),
            np.int32(INTEGRATORS.index(params.integrator)),
            np.int32(params.max_steps),
            np.float32(params.max_length_mm),
            np.float32(cos_max),
            np.float32(params.fa_threshold),
            np.float32(params.mask_tolerance_mm),
            np.int32(params.normalize),
            np.int32(params.store_every),
            np.int32(params.stop_at_target),
            np.int32(slots),
            counter,
            points,
            cms,
            out["stored"],
            out["stop"],
            out["valid"],
            out["steps"],
            out["reached"],
            out["cm_target"],
            out["cm_end"],
            out["excursion"],
        ),
        shared_mem=CELL_CACHE_BYTES * KERNEL_BLOCK,
    )
    return (
        points, cms, out["stored"], out["stop"], out["valid"].astype(bool), out["steps"], out["reached"],
        out["cm_target"], out["cm_end"], out["excursion"],
    )  # fmt: skip
