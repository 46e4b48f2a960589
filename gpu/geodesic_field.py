"""The field geodesic tractography (:mod:`gpu.geodesic`) traces in: the metric ``G = C⁻¹`` made
from the tensors (:func:`prepare_metric`: the tensor's regularisation and the metric of
:mod:`gpu.geodesic_metrics`), the region map's bits (tracking region, target) and the layout
the CUDA kernel reads (:func:`packed_field`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import sym3
from .backend import Backend, get_backend
from .geodesic_metrics import (
    adaptive_conformal_factor,
    conformal_exponent,
    metric_for,
    metric_inverse,
)
from .geodesic_params import MetricParams
from .interpolate import trilinear

TRACK, TARGET = 1, 2  # bits of the region map


PACKED_CHUNKS = 4  # 16-byte chunks per voxel of the kernel's field (packed_field)


@dataclass
class GeodesicField:
    """``data`` (X, Y, Z, 24) float32: C, ∂G/∂x, ∂G/∂y, ∂G/∂z (mm; float16 values times
    ``1 / derivative_scale``); ``region`` bits (1 track, 2 target)."""

    data: np.ndarray
    region: np.ndarray
    voxel_size: np.ndarray
    gain: float
    repaired: int
    sharpened: int
    notes: list
    derivative_scale: float = 1.0
    # The kernel's packed copy per device (shared by the fields with_regions makes).
    packed: dict = field(default_factory=dict, repr=False, compare=False)
    #: the metric parameters it was made with (``auto`` resolved)
    metric_params: MetricParams | None = None
    # The distance method's graphs and distance maps (:mod:`gpu.geodesic_eikonal`), shared by
    # the fields with_regions makes, so that an ROI edit reuses what it does not change.
    graphs: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.region.shape

    def metric(self, points_vox: np.ndarray) -> np.ndarray:
        """G (6 components) at voxel coordinates (the inverse of the interpolated C)."""
        c = trilinear(np, self.data[..., :6], np.asarray(points_vox, np.float64))
        return sym3.inverse(np, c)


def _leading_minors_positive(xp, b):
    det = sym3.determinant(b)
    minor2 = b[..., 0] * b[..., 3] - b[..., 1] ** 2
    return (b[..., 0] > 0) & (minor2 > 0) & (det > 0), det


def prepare_metric(
    tensor,
    voxel_size,
    params: MetricParams = MetricParams(),
    *,
    mask=None,
    target=None,
    device: str | Backend = "auto",
    det_epsilon: float = 1e-9,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> GeodesicField:
    """Pre-process the tensors, invert, differentiate; pack the field the trackers read.

    ``progress``/``cancelled`` reach the adaptive metric's conjugate gradients (the one long
    step: about 13 s on two CPU cores for 590 000 voxels); a cancelled run raises
    :class:`gpu.backend.Cancelled`."""
    backend = get_backend(device)
    xp = backend.xp
    params = metric_for(params, "rays")  # auto, when the method is not known: ray tracing's metric
    tensor = np.asarray(tensor)
    if tensor.ndim != 4 or tensor.shape[-1] != 6:
        raise ValueError(f"a tensor field must be (X, Y, Z, 6), got shape {tensor.shape}")
    shape = tensor.shape[:3]
    voxel_size = np.asarray(voxel_size, np.float64).reshape(3)
    if not ((voxel_size > 0).all() and np.isfinite(voxel_size).all()):
        raise ValueError(f"voxel sizes must be positive, got {voxel_size}")
    notes = []
    a = xp.asarray(tensor, dtype=xp.float64)
    finite = xp.isfinite(a).all(axis=-1)
    a = xp.where(finite[..., None], a, 0.0)
    present = finite & (xp.abs(a).sum(axis=-1) > 0)
    if not bool(present.any()):
        raise ValueError("the tensor field is empty (all zero or NaN)")
    gain = params.gain
    if gain == 0:
        md = sym3.trace(a[present]) / 3.0
        mean = float(md[md > 0].mean()) if bool((md > 0).any()) else 1.0
        gain = 1.0 / mean
    b = a * gain
    positive, det = _leading_minors_positive(xp, b)
    good = positive & (xp.abs(det) > det_epsilon)
    identity = xp.asarray([1.0, 0, 0, 1.0, 0, 1.0])
    b = xp.where(good[..., None], b, identity)
    repaired = int((present & ~good).sum())
    if repaired:
        notes.append(f"{repaired} voxels had singular or non-positive-definite tensors: replaced by the identity")
    if int((~finite).sum()):
        notes.append(f"{int((~finite).sum())} voxels with NaN or infinite tensors were replaced by the identity")
    sharpened = 0
    if params.sharpen_power > 1 and params.sharpen_fa > 0:
        # Only real tensors: the identity put in for empty or repaired voxels stays as it is.
        low = good & present & (sym3.fractional_anisotropy_from_invariants(xp, b) < params.sharpen_fa)
        matrix = sym3.to_matrix(xp, b[low])
        power = matrix
        for _ in range(int(params.sharpen_power) - 1):
            power = power @ matrix
        b[low] = sym3.from_matrix(xp, power)
        sharpened = int(low.sum())
    b, _reference = metric_inverse(xp, b, good & present, conformal_exponent(params.metric, params.conformal_power))
    if params.metric == "adaptive":
        weight = xp.where(good & present, sym3.fractional_anisotropy_from_invariants(xp, b) ** 2, 0.0)
        phi, info = adaptive_conformal_factor(xp, b, weight, voxel_size, progress=progress, cancelled=cancelled)
        b = b * xp.exp(-2.0 * phi)[..., None]
        notes.append(
            f"adaptive metric: conformal factor from {info['iterations']} conjugate-gradient iterations, "
            f"{info['curvature_explained']:.0%} of the eigenvector curves' geodesic curvature explained"
        )
    g = sym3.inverse(xp, b)
    derivatives = xp.zeros((*shape, 18))
    for axis in range(3):
        if shape[axis] > 1:
            derivatives[..., 6 * axis : 6 * (axis + 1)] = xp.gradient(g, float(voxel_size[axis]), axis=axis)
    scale = derivative_scale(float(xp.abs(derivatives).max()))
    data = xp.empty((*shape, 24), dtype=xp.float32)
    data[..., :6] = b
    data[..., 6:] = (derivatives * scale).astype(xp.float16).astype(xp.float32) / np.float32(scale)
    bare = GeodesicField(
        backend.to_host(data), np.zeros(shape, np.uint8), voxel_size, gain, repaired, sharpened, notes, scale,
        metric_params=params,
    )  # fmt: skip
    return with_regions(bare, mask, target)


def derivative_scale(largest: float) -> float:
    """The power of two that brings the largest derivative magnitude into [2¹⁴, 2¹⁵) (float16's
    largest finite value is 65504), so the float16 copies keep their relative precision."""
    if not (largest > 0 and math.isfinite(largest)):
        return 1.0
    return 2.0 ** (14 - math.floor(math.log2(largest)))


def packed_field(backend: Backend, fld: GeodesicField):
    """The kernel's layout on the device: per voxel C as 6 float32, the 18 scaled
    derivatives as float16, 4 bytes of padding (64 bytes). Made once per field and device."""
    key = (backend.name, backend.device_name)
    if key not in fld.packed:
        xp = backend.xp
        data = backend.asarray(fld.data).reshape(-1, 24)
        words = xp.zeros((len(data), 4 * PACKED_CHUNKS), xp.uint32)
        words[:, :6] = xp.ascontiguousarray(data[:, :6]).view(xp.uint32)
        halves = (data[:, 6:] * np.float32(fld.derivative_scale)).astype(xp.float16)
        words[:, 6:15] = xp.ascontiguousarray(halves).view(xp.uint32)
        fld.packed.clear()
        fld.packed[key] = words
    return fld.packed[key]


def with_regions(fld: GeodesicField, mask=None, target=None) -> GeodesicField:
    """The same metric with another tracking mask and target (the expensive part is reused)."""
    region = np.full(fld.shape, TRACK, np.uint8)
    for name, volume in (("mask", mask), ("target", target)):
        if volume is not None and np.asarray(volume).shape != fld.shape:
            raise ValueError(f"the {name} has shape {np.asarray(volume).shape}, the tensor field {fld.shape}")
    if mask is not None:
        region[np.asarray(mask) == 0] = 0
    if target is not None:
        region[np.asarray(target) != 0] |= TARGET
    return GeodesicField(
        fld.data, region, fld.voxel_size, fld.gain, fld.repaired, fld.sharpened, list(fld.notes),
        fld.derivative_scale, fld.packed, fld.metric_params, fld.graphs,
    )  # fmt: skip
