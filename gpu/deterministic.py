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
from dataclasses import dataclass, field

import numpy as np

from . import cuda, deterministic_host, sym3, tracking
from .backend import Backend, get_backend
from .engines import ARRAYS, COMPILED, KERNEL, choose_engine, engine_names
from .host import host_threads
from .indices import flatnonzero
from .interpolate import trilinear
from .params import meta
from .streamlines import LOW_FA, SHARP_ANGLE, StreamlineBatch, StreamlineScalars
from .tracking import drop

INTEGRATORS = ("euler", "rk4")
METHODS = ("eigenvector", "tensorline")
ENGINES = engine_names((KERNEL, COMPILED, ARRAYS))
#: What kernels/deterministic.cu receives at compile time: its stop and region codes.
KERNEL_DEFINES = tracking.KERNEL_DEFINES
#: The headers it is compiled with.
KERNEL_HEADERS = tracking.KERNEL_HEADERS
# The seed's eigenvector sign is fixed by this reference direction, so both engines
# start every streamline the same way round.
SIGN_REFERENCE = np.array([3.0, 2.0, 1.0]) / math.sqrt(14.0)


CHOICES = {"integrator": INTEGRATORS, "method": METHODS}


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
        ),
    )
    min_length_mm: float = field(
        default=20.0,
        metadata=meta("Min length", "drop streamlines shorter than this", "mm", (0.0, 1000.0)),
    )
    max_length_mm: float = field(
        default=250.0,
        metadata=meta("Max length", "end streamlines at this length", "mm", (1.0, 2000.0)),
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
        ),
    )
    tensorline_puncture: float = field(
        default=0.2,
        metadata=meta(
            "Puncture",
            "tensorlines: weight w of the deflected incoming direction",
            "",
            (0.0, 1.0),
        ),
    )
    keep_truncated: bool = field(
        default=True,
        metadata=meta(
            "Keep truncated",
            "keep streamlines that reached the max length",
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
    voxel_size = tracking.checked_voxel_size(voxel_size)
    notes = []
    finite = np.isfinite(tensor).all(axis=-1)
    tensor8 = np.zeros((*shape, 8), np.float32)
    tensor8[..., :6] = np.where(finite[..., None], tensor, 0.0)
    if (~finite).any():
        notes.append(f"{int((~finite).sum())} voxels with NaN or infinite tensors were treated as empty")
    region = tracking.region_map(shape, mask, stop, "tensor field")
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


def _track_arrays(xp, field, region, scale, seeds, params: DeterministicParams, dtype):
    """Both halves of every seed's streamline (:func:`gpu.tracking.walk`'s buffers)."""
    n = len(seeds)
    tensorline = params.method == "tensorline"
    cos_max = math.cos(math.radians(params.max_angle_deg))
    h = xp.asarray(scale * params.step_mm, dtype=dtype)  # one step along each axis, in voxels

    def start(p0, valid, stop):
        ref = xp.broadcast_to(xp.asarray(SIGN_REFERENCE, dtype=dtype), (n, 3))
        d0, fa0 = _direction(xp, field, p0, ref, params, tensorline=False)
        low = valid & (fa0 < params.fa_threshold)
        stop[low] = LOW_FA
        return d0, flatnonzero(xp, valid & ~low)

    def advance(p, d):
        if params.integrator != "rk4":
            return d

        def at(x):
            return _direction(xp, field, x, d, params, tensorline)[0]

        k2 = at(p + 0.5 * h * d)
        k3 = at(p + 0.5 * h * k2)
        k4 = at(p + h * k3)
        return _unit(xp, d + 2.0 * k2 + 2.0 * k3 + k4, d)

    def turn(stop, idx, q, v, steps, end):
        e, fa = _direction(xp, field, q, v, params, tensorline)
        live = drop(stop, idx, end, fa < params.fa_threshold, LOW_FA)
        live &= drop(stop, idx, end, live & (xp.sum(e * v, axis=1) < cos_max), SHARP_ANGLE)
        return idx[live], q[live], e[live], steps[live]

    return tracking.walk(xp, region, seeds, params.max_steps, h, start=start, advance=advance, turn=turn, dtype=dtype)


# ----------------------------------------------------------------------------- CUDA kernel
def _kernel():
    return cuda.function("deterministic.cu", "track_deterministic", KERNEL_HEADERS, KERNEL_DEFINES)


def _track_kernel(backend: Backend, field, region, scale, seeds, params: DeterministicParams):
    h = scale * params.step_mm
    arguments = (
        *(np.float64(x) for x in h),
        np.float64(params.fa_threshold),
        np.float64(math.cos(math.radians(params.max_angle_deg))),
        np.int32(params.max_steps),
        np.int32(params.integrator == "rk4"),
        np.int32(params.method == "tensorline"),
        np.float64(params.tensorline_puncture),
    )
    return tracking.launch(_kernel(), backend, field, region, seeds, params.max_steps, arguments)


# ----------------------------------------------------------------------------- driver
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
    requested, engine = engine, choose_engine(engine, backend, available=(KERNEL, COMPILED, ARRAYS),
                                              method="deterministic tracking")  # fmt: skip
    if engine == COMPILED and not deterministic_host.available():  # numba (the cpu extra) missing
        if requested == COMPILED:
            deterministic_host.require()
        engine = ARRAYS
    tf = tensor if isinstance(tensor, TrackingField) else prepare_field(tensor, voxel_size, mask, stop)
    seeds = np.asarray(seeds, dtype=np.float64).reshape(-1, 3)
    field = backend.asarray(tf.tensor8)
    region = backend.asarray(tf.region)
    scale = 1.0 / tf.voxel_size
    if max_batch is None and engine == COMPILED:
        max_batch = max(4096, 1024 * host_threads())  # every thread gets whole blocks of seeds

    def track_chunk(a: int, b: int, chunk):
        if engine == KERNEL:
            return _track_kernel(backend, field, region, scale, chunk, params)
        if engine == COMPILED:
            return deterministic_host.track_compiled(field, region, scale, chunk, params)
        return _track_arrays(xp, field, region, xp.asarray(scale), chunk, params, np.float64)

    yield from tracking.track_batches(
        backend, seeds, params, track_chunk, max_batch=max_batch, progress=progress, cancelled=cancelled,
        scalars=scalars,
    )  # fmt: skip


def track_all(tensor, seeds, params: DeterministicParams = DeterministicParams(), **kwargs) -> StreamlineBatch:
    """All batches of :func:`track` joined, with provenance (parameters, backend, timing)."""
    backend = get_backend(kwargs.pop("device", "auto"))
    t0 = time.perf_counter()
    batches = list(track(tensor, seeds, params, device=backend, **kwargs))
    return tracking.joined(batches, "deterministic", params, backend, seeds, t0)
