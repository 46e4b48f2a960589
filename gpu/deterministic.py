"""Deterministic tensor tractography: streamlines along the main eigenvector.

Every streamline starts at a seed (voxel coordinates) and is tracked in both
directions, forward along the seed's main eigenvector first, then backward with
what is left of the length budget; the two halves are joined through the seed.

At every position the tensor is interpolated trilinearly (all six components),
then decomposed (``sym3.principal``: Eberly's closed form); the eigenvector's sign
is chosen to continue the incoming direction. Steps are ``step_mm`` long in
millimetres (the voxel size scales each axis), taken with Euler or classical RK4.
With ``method="tensorline"`` the direction is deflected as in Weinstein, Kindlmann
& Lundberg (1999): ``v_out ∝ cl·e1 + (1 − cl)·((1 − w)·v_in + w·D v_in/|D v_in|)``,
with ``cl = (λ1 − λ2)/λ1`` and the puncture weight ``w``.

Rules, per step from point ``p`` with direction ``v`` to ``q = p + h v``:

1. the length budget is used up → stop (``max length``), ``q`` not taken;
2. ``q`` outside the volume or the mask → stop, ``q`` not taken;
3. ``q`` is appended; inside a stop region → stop;
4. FA of the tensor at ``q`` below the threshold → stop;
5. the new direction turns more than ``max_angle`` from ``v`` → stop.

A seed outside the volume or the mask gives no streamline; a seed below the FA
threshold gives a single point (removed by any positive minimum length). Then
streamlines shorter than ``min_length_mm`` are dropped, and with
``keep_truncated=False`` so are those that ran out of length budget.

Two engines compute this: array operations over all live streamlines of a batch
(NumPy, the reference; also runs on CuPy) and the CUDA kernel
``kernels/deterministic.cu`` (one thread per seed), the GPU default. Both compute
in float64 from a float32 tensor field and return float32 points: the kernel is a
few per cent of the end-to-end time (gathering and copying the points dominate), so
double precision costs nothing visible and keeps the two engines within 1e-5 voxel.
What the caller needs at every point (FA, lengths: ``track(scalars=...)``) is computed
on the device too, before the copy, so that the host only writes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from . import cuda, sym3, transfer
from .backend import Backend, get_backend, iter_batched
from .engines import ARRAYS, KERNEL, choose_engine, engine_names
from .interpolate import inside_volume, lookup, trilinear
from .params import meta
from .streamlines import (
    LOW_FA,
    MAX_LENGTH,
    OUTSIDE_MASK,
    OUTSIDE_VOLUME,
    SHARP_ANGLE,
    STOP_REGION,
    StreamlineBatch,
    StreamlineScalars,
    pack_rows,
    stop_code_defines,
)

INTEGRATORS = ("euler", "rk4")
METHODS = ("eigenvector", "tensorline")
ENGINES = engine_names((KERNEL, ARRAYS))
# Region codes of the tracking map.
OUTSIDE, TRACK, STOP = 0, 1, 2
#: What kernels/deterministic.cu receives at compile time: its stop and region codes.
KERNEL_DEFINES = (
    *stop_code_defines("MAX_LENGTH", "OUTSIDE_VOLUME", "OUTSIDE_MASK", "LOW_FA", "SHARP_ANGLE", "STOP_REGION"),
    ("REGION_OUTSIDE", OUTSIDE),
    ("REGION_STOP", STOP),
)
# The seed's eigenvector sign is fixed by this reference direction, so both engines
# start every streamline the same way round.
SIGN_REFERENCE = np.array([3.0, 2.0, 1.0]) / math.sqrt(14.0)


CHOICES = {"integrator": INTEGRATORS, "method": METHODS}
#: Most seeds of one GPU batch. A whole brain would fit one batch of a large GPU; its points all
#: come to the host at once (HCP: 235 M points, 2.8 GB). Batches of 2^18 seeds (~60 M points,
#: 0.7 GB) bound that and cost a few more kernel launches; every seed is tracked alone, so the
#: streamlines do not depend on the batching.
GPU_MAX_BATCH = 1 << 18


@dataclass(frozen=True)
class DeterministicParams:
    """Parameters of deterministic tracking (lengths in millimetres, angles in degrees)."""

    step_mm: float = field(
        default=0.5,
        metadata=meta(
            "Step",
            "step length",
            "mm",
            (0.05, 5.0),
            flags=("--step", "--step-mm"),
            cli_help="step length in mm (as track geodesic's --step)",
        ),
    )
    fa_threshold: float = field(
        default=0.15, metadata=meta("FA threshold", "stop where FA falls below this", "", (0.0, 0.99))
    )
    max_angle_deg: float = field(
        default=45.0,
        metadata=meta(
            "Max angle",
            "stop where one step turns more than this",
            "°",
            (1.0, 180.0),
            flags=("--max-angle",),
            cli_help="max turn per step in degrees",
        ),
    )
    min_length_mm: float = field(
        default=20.0,
        metadata=meta("Min length", "drop streamlines shorter than this", "mm", (0.0, 1000.0), flags=("--min-length",)),
    )
    max_length_mm: float = field(
        default=250.0,
        metadata=meta("Max length", "end streamlines at this length", "mm", (1.0, 2000.0), flags=("--max-length",)),
    )
    integrator: str = field(
        default="euler",
        metadata=meta(
            "Integrator", "Euler: one tensor per step; RK4: four, more accurate on curves", choices=INTEGRATORS
        ),
    )
    method: str = field(
        default="eigenvector",
        metadata=meta(
            "Direction",
            "follow e1, or deflect by the tensor (Weinstein tensorlines, through crossings)",
            choices=METHODS,
            flags=("--method",),
        ),
    )
    tensorline_puncture: float = field(
        default=0.2,
        metadata=meta(
            "Puncture",
            "tensorlines: weight w of the deflected incoming direction",
            "",
            (0.0, 1.0),
            flags=("--puncture",),
        ),
    )
    keep_truncated: bool = field(
        default=True,
        metadata=meta(
            "Keep truncated",
            "keep streamlines that reached the max length",
            flags=("--discard-truncated",),
            negated=True,
            cli_help="drop streamlines that reached --max-length instead of keeping them",
        ),
    )

    def __post_init__(self) -> None:
        checks = [
            (self.step_mm > 0 and math.isfinite(self.step_mm), f"step must be positive, got {self.step_mm}"),
            (0 <= self.fa_threshold < 1, f"FA threshold must be in [0, 1), got {self.fa_threshold}"),
            (0 < self.max_angle_deg <= 180, f"max angle must be in (0, 180] degrees, got {self.max_angle_deg}"),
            (self.min_length_mm >= 0, f"min length must be ≥ 0, got {self.min_length_mm}"),
            (
                self.max_length_mm >= self.step_mm,
                f"max length ({self.max_length_mm} mm) must be at least one step ({self.step_mm} mm)",
            ),
            (
                self.min_length_mm <= self.max_length_mm,
                f"min length ({self.min_length_mm}) exceeds max length ({self.max_length_mm})",
            ),
            (self.integrator in INTEGRATORS, f"integrator must be one of {', '.join(INTEGRATORS)}"),
            (self.method in METHODS, f"method must be one of {', '.join(METHODS)}"),
            (0 <= self.tensorline_puncture <= 1, "tensorline puncture weight must be in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def max_steps(self) -> int:
        """Steps of the whole streamline (both halves together)."""
        return math.floor(self.max_length_mm / self.step_mm + 1e-9)


@dataclass
class TrackingField:
    """What the tracker reads: tensors padded to 8 floats per voxel (two aligned float4
    loads per corner on the GPU), a region map (0 outside the mask, 1 track, 2 stop)
    and the voxel size in millimetres."""

    tensor8: np.ndarray  # (X, Y, Z, 8) float32
    region: np.ndarray  # (X, Y, Z) uint8
    voxel_size: np.ndarray  # (3,)
    notes: list

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.region.shape


def prepare_field(tensor, voxel_size, mask=None, stop=None) -> TrackingField:
    """Check and pack the inputs of tracking.

    ``tensor`` (X, Y, Z, 6) in voxel axes (order xx, xy, xz, yy, yz, zz); voxels with
    NaN or infinite components are zeroed (FA 0: tracking stops there) and counted.
    """
    tensor = np.asarray(tensor)
    if tensor.ndim != 4 or tensor.shape[-1] != 6:
        raise ValueError(f"a tensor field must be (X, Y, Z, 6), got shape {tensor.shape}")
    shape = tensor.shape[:3]
    voxel_size = np.asarray(voxel_size, dtype=np.float64).reshape(3)
    if not (np.isfinite(voxel_size).all() and (voxel_size > 0).all()):
        raise ValueError(f"voxel sizes must be positive, got {voxel_size}")
    notes = []
    finite = np.isfinite(tensor).all(axis=-1)
    tensor8 = np.zeros((*shape, 8), np.float32)
    tensor8[..., :6] = np.where(finite[..., None], tensor, 0.0)
    if (~finite).any():
        notes.append(f"{int((~finite).sum())} voxels with NaN or infinite tensors were treated as empty")
    region = np.full(shape, TRACK, np.uint8)
    for name, volume, code in (("mask", mask, OUTSIDE), ("stop region", stop, STOP)):
        if volume is None:
            continue
        volume = np.asarray(volume)
        if volume.shape != shape:
            raise ValueError(f"the {name} has shape {volume.shape}, the tensor field {shape}")
        if code == OUTSIDE:
            region[volume == 0] = OUTSIDE
        else:
            region[(volume != 0) & (region != OUTSIDE)] = STOP
    return TrackingField(tensor8, region, voxel_size, notes)


# ----------------------------------------------------------------------------- arrays engine
def _direction(xp, field, points, v_ref, params: DeterministicParams, tensorline: bool):
    """Unit direction at ``points`` continuing ``v_ref`` (``(N, 3)``), and the FA there."""
    tensor = trilinear(xp, field, points)[:, :6]
    lams, e1 = sym3.principal(xp, tensor)
    fa = sym3.fractional_anisotropy_from_invariants(xp, tensor)
    e1 = xp.stack(e1, -1)
    flip = xp.sum(e1 * v_ref, axis=1) < 0
    e1 = xp.where(flip[:, None], -e1, e1)
    if tensorline:
        l1, l2 = lams[0], lams[1]
        cl = xp.clip(xp.where(l1 > 0, (l1 - l2) / xp.where(l1 > 0, l1, 1.0), 0.0), 0.0, 1.0)[:, None]
        dv = xp.stack(sym3._apply(sym3.components(tensor), tuple(v_ref.T)), -1)
        norm = xp.sqrt(xp.sum(dv * dv, axis=1, keepdims=True))
        dv = xp.where(norm > 0, dv / xp.where(norm > 0, norm, 1.0), v_ref)
        w = params.tensorline_puncture
        e1 = cl * e1 + (1.0 - cl) * ((1.0 - w) * v_ref + w * dv)
        e1 = _unit(xp, e1, v_ref)
    return e1, fa


def _unit(xp, v, fallback):
    norm = xp.sqrt(xp.sum(v * v, axis=1, keepdims=True))
    return xp.where(norm > 0, v / xp.where(norm > 0, norm, 1.0), fallback)


def _drop(stop, idx, end: int, failed, reason: int):
    """Record why the ``failed`` streamlines of ``idx`` stopped at ``end``; the mask of the others."""
    stop[idx[failed], end] = reason
    return ~failed


def _track_arrays(xp, field, region, scale, seeds, params: DeterministicParams, dtype):
    """Both halves of every seed's streamline: (buffer (N, 2M+1, 3), counts (N, 2), stop (N, 2))."""
    n, m = len(seeds), params.max_steps
    shape = region.shape
    tensorline = params.method == "tensorline"
    buf = xp.zeros((n, 2 * m + 1, 3), np.float32)
    count = xp.zeros((n, 2), np.int32)
    stop = xp.zeros((n, 2), np.uint8)
    p0 = seeds.astype(dtype)
    buf[:, m] = p0
    inside = inside_volume(xp, p0, shape)
    code = lookup(xp, region, p0)
    stop[~inside] = OUTSIDE_VOLUME
    stop[inside & (code == OUTSIDE)] = OUTSIDE_MASK
    valid = inside & (code != OUTSIDE)
    ref = xp.broadcast_to(xp.asarray(SIGN_REFERENCE, dtype=dtype), (n, 3))
    d0, fa0 = _direction(xp, field, p0, ref, params, tensorline=False)
    low = valid & (fa0 < params.fa_threshold)
    stop[low] = LOW_FA
    h = xp.asarray(scale * params.step_mm, dtype=dtype)  # one step along each axis, in voxels
    cos_max = math.cos(math.radians(params.max_angle_deg))
    start = xp.flatnonzero(valid & ~low)
    for end, sign in ((1, 1.0), (0, -1.0)):
        budget = xp.full(n, m, np.int32) if end == 1 else m - count[:, 1]
        idx = start
        p, d = p0[idx], sign * d0[idx]
        steps = xp.zeros(len(idx), np.int32)
        while len(idx):
            live = _drop(stop, idx, end, steps >= budget[idx], MAX_LENGTH)
            idx, p, d, steps = idx[live], p[live], d[live], steps[live]
            if params.integrator == "rk4":

                def at(x, d=d):
                    return _direction(xp, field, x, d, params, tensorline)[0]

                k2 = at(p + 0.5 * h * d)
                k3 = at(p + 0.5 * h * k2)
                k4 = at(p + h * k3)
                v = _unit(xp, d + 2.0 * k2 + 2.0 * k3 + k4, d)
            else:
                v = d
            q = p + h * v
            ins = inside_volume(xp, q, shape)
            code = lookup(xp, region, q)
            live = _drop(stop, idx, end, ~ins, OUTSIDE_VOLUME)
            live &= _drop(stop, idx, end, ins & (code == OUTSIDE), OUTSIDE_MASK)
            idx, q, v, code, steps = idx[live], q[live], v[live], code[live], steps[live] + 1
            buf[idx, m + steps if end == 1 else m - steps] = q
            count[idx, end] = steps
            live = _drop(stop, idx, end, code == STOP, STOP_REGION)
            idx, q, v, steps = idx[live], q[live], v[live], steps[live]
            e, fa = _direction(xp, field, q, v, params, tensorline)
            live = _drop(stop, idx, end, fa < params.fa_threshold, LOW_FA)
            live &= _drop(stop, idx, end, live & (xp.sum(e * v, axis=1) < cos_max), SHARP_ANGLE)
            idx, p, d, steps = idx[live], q[live], e[live], steps[live]
    return buf, count, stop, valid


# ----------------------------------------------------------------------------- CUDA kernel
def _kernel():
    return cuda.function("deterministic.cu", "track_deterministic", ("sym3.cuh", "tracking.cuh"), KERNEL_DEFINES)


def _track_kernel(backend: Backend, field, region, scale, seeds, params: DeterministicParams):
    cp = backend.xp
    n, m = len(seeds), params.max_steps
    buf = cp.empty((n, 2 * m + 1, 3), cp.float32)
    count = cp.zeros((n, 2), cp.int32)
    stop = cp.zeros((n, 2), cp.uint8)
    valid = cp.zeros(n, cp.uint8)
    seeds64 = cp.ascontiguousarray(seeds, dtype=cp.float64)
    h = scale * params.step_mm
    block = 128
    _kernel()(
        ((n + block - 1) // block,),
        (block,),
        (
            field,
            region,
            np.int32(region.shape[0]),
            np.int32(region.shape[1]),
            np.int32(region.shape[2]),
            seeds64,
            np.int32(n),
            np.float64(h[0]),
            np.float64(h[1]),
            np.float64(h[2]),
            np.float64(params.fa_threshold),
            np.float64(math.cos(math.radians(params.max_angle_deg))),
            np.int32(m),
            np.int32(params.integrator == "rk4"),
            np.int32(params.method == "tensorline"),
            np.float64(params.tensorline_puncture),
            buf,
            count,
            stop,
            valid,
        ),
    )
    return buf, count, stop, valid.astype(bool)


# ----------------------------------------------------------------------------- driver
def _compact(xp, buf, count, stop, valid, seed_offset: int, params: DeterministicParams,
             scalars: StreamlineScalars | None = None) -> StreamlineBatch:  # fmt: skip
    """Keep the streamlines that pass the length filters, joined into ragged arrays on the host;
    with ``scalars``, their values computed where the points are, before the copy."""
    m = params.max_steps
    back, fwd = count[:, 0].astype(np.int64), count[:, 1].astype(np.int64)
    n_points = back + fwd + 1
    length = (n_points - 1) * params.step_mm
    keep = valid & (length >= params.min_length_mm - 1e-6)
    if not params.keep_truncated:
        keep &= ~(stop == MAX_LENGTH).any(axis=1)
    kept = xp.flatnonzero(keep)
    points, offsets = pack_rows(xp, buf, kept, m - back[kept], n_points[kept])
    to_host = transfer.to_host  # large arrays through pinned buffers (gpu.transfer)
    host_offsets = to_host(offsets)
    point_scalars, streamline_scalars = {}, {}
    if scalars is not None:
        point_scalars, streamline_scalars = scalars.compute(xp, points, offsets, host_offsets)
    # what each filter left, so an empty result can say which one emptied it
    filters = {
        "started": int(valid.sum()),
        "left_seed": int((valid & (n_points > 1)).sum()),
        "long_enough": int((valid & (length >= params.min_length_mm - 1e-6)).sum()),
    }
    return StreamlineBatch(
        to_host(points),
        host_offsets,
        to_host(kept) + seed_offset,
        to_host(stop[kept]),
        to_host(back[kept]),
        filters,
        {k: to_host(v) for k, v in point_scalars.items()},
        {k: to_host(v) for k, v in streamline_scalars.items()},
    )


def batch_bytes(params: DeterministicParams) -> int:
    """Working memory of one seed: its point buffer, plus the gather of its points."""
    return (2 * params.max_steps + 1) * 3 * 4 * 3 + 256


def track(
    tensor,
    seeds,
    params: DeterministicParams = DeterministicParams(),
    *,
    voxel_size=(1.0, 1.0, 1.0),
    mask=None,
    stop=None,
    device: str | Backend = "auto",
    engine: str = "auto",
    max_batch: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    scalars: StreamlineScalars | None = None,
) -> Iterator[StreamlineBatch]:
    """Track from ``seeds`` (``(N, 3)`` voxel coordinates), yielding batches of streamlines.

    ``tensor`` is an ``(X, Y, Z, 6)`` field in voxel axes or a :class:`TrackingField`.
    Each yielded :class:`StreamlineBatch` holds the kept streamlines of one batch of
    seeds, in voxel coordinates, with ``provenance`` (timings, counts, backend).
    Cancelling between batches raises :class:`gpu.backend.Cancelled`.

    ``scalars`` (:class:`~gpu.streamlines.StreamlineScalars`): FA per point and length per
    streamline computed on the backend before the points are copied to the host (on a GPU the
    host then only writes them), in each batch's ``point_scalars``/``streamline_scalars``.
    """
    backend = get_backend(device)
    xp = backend.xp
    engine = choose_engine(engine, backend, available=(KERNEL, ARRAYS), method="deterministic tracking")
    tf = tensor if isinstance(tensor, TrackingField) else prepare_field(tensor, voxel_size, mask, stop)
    seeds = np.asarray(seeds, dtype=np.float64).reshape(-1, 3)
    field = backend.asarray(tf.tensor8)
    region = backend.asarray(tf.region)
    scale = 1.0 / tf.voxel_size
    if max_batch is None and not backend.is_gpu:
        max_batch = 4096  # the arrays engine walks all live streamlines step by step: keep them in cache
    elif max_batch is None:
        max_batch = GPU_MAX_BATCH

    def work(a: int, b: int) -> StreamlineBatch:
        t0 = time.perf_counter()
        chunk = backend.asarray(seeds[a:b])
        if engine == "kernel":
            result = _track_kernel(backend, field, region, scale, chunk, params)
        else:
            result = _track_arrays(xp, field, region, xp.asarray(scale), chunk, params, np.float64)
        batch = _compact(xp, *result, a, params, scalars)
        backend.synchronize()
        batch.provenance = {
            **batch.provenance,
            "seeds": b - a,
            "streamlines": len(batch),
            "seconds": time.perf_counter() - t0,
        }
        return batch

    yield from iter_batched(
        backend,
        len(seeds),
        batch_bytes(params),
        work,
        progress=progress,
        cancelled=cancelled,
        fraction=0.4,
        maximum=max_batch,
    )


def track_all(tensor, seeds, params: DeterministicParams = DeterministicParams(), **kwargs) -> StreamlineBatch:
    """All batches of :func:`track` joined, with provenance (parameters, backend, timing)."""
    backend = get_backend(kwargs.pop("device", "auto"))
    t0 = time.perf_counter()
    batches = list(track(tensor, seeds, params, device=backend, **kwargs))
    out = StreamlineBatch.concatenate(batches)
    out.provenance = {
        "method": "deterministic",
        "parameters": asdict(params),
        "backend": backend.name,
        "device": backend.device_name,
        "seeds": len(np.asarray(seeds).reshape(-1, 3)),
        "streamlines": len(out),
        "points": len(out.points),
        "seconds": time.perf_counter() - t0,
        "stop_reasons": out.reason_counts(),
    }
    return out
