"""A spatial transform between two images, in the ITK/ANTs convention, and what it does to data.

A :class:`Registration` joins a *fixed* image and a *moving* image (the names of the registration
that made it: the moving image was brought onto the fixed one). Like ITK and ANTs, the transform
maps **points of the fixed space to points of the moving space** (it "pulls": to draw the moving
image on the fixed grid, each fixed voxel looks up the moving image where the transform sends it):

    moving = A · (x + w(x))          A: 4×4 affine (RAS mm), w: displacement field on the fixed grid

and the inverse, used to push points (a streamline of the moving space into the fixed space):

    y = A⁻¹ · moving,   fixed = y + w⁻¹(y)

This is the composite ``antsApplyTransforms -t 1Warp.nii.gz -t 0GenericAffine.mat`` applies, with
the fields in RAS here and in LPS in the files (:mod:`app.io.transforms` converts). Images are
resampled with trilinear or nearest-neighbour interpolation (:func:`scipy.ndimage.map_coordinates`),
one slab of reference voxels at a time so a 1 mm whole-brain grid never holds all its coordinates
at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from tractlens.gpu.backend import Cancelled

from .errors import InputError
from .grid import Grid

KINDS = ("identity", "rigid", "affine", "syn", "fsl", "ants")
INTERPOLATIONS = ("linear", "nearest")

#: Reference voxels resampled per slab (three float64 coordinates each: ~48 MB).
SLAB_VOXELS = 2_000_000


@dataclass(frozen=True, eq=False)
class Registration:
    """A fixed ↔ moving transform (see the module's docstring for the convention)."""

    fixed: Grid
    moving: Grid
    affine: np.ndarray = field(repr=False)
    warp: np.ndarray | None = field(default=None, repr=False)
    inverse_warp: np.ndarray | None = field(default=None, repr=False)
    kind: str = "affine"
    fixed_name: str = "fixed"
    moving_name: str = "moving"
    template: str | None = None
    template_side: str | None = None
    folder: str | None = None
    metric: str = ""

    def __post_init__(self):
        affine = np.array(self.affine, dtype=np.float64)
        if affine.shape != (4, 4) or not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-9:
            raise ValueError("a registration needs a finite, invertible 4x4 affine")
        affine.setflags(write=False)
        object.__setattr__(self, "affine", affine)
        for name in ("warp", "inverse_warp"):
            value = getattr(self, name)
            if value is not None:
                value = np.asarray(value, dtype=np.float32)
                if value.shape != (*self.fixed.shape, 3):
                    raise ValueError(
                        f"the {name} field must be {(*self.fixed.shape, 3)} on the fixed grid, got {value.shape}"
                    )
                object.__setattr__(self, name, value)
        if self.warp is None and self.inverse_warp is not None:
            raise ValueError("an inverse field without its forward field")
        if self.kind not in KINDS:
            raise ValueError(f"unknown registration kind {self.kind!r}")
        if self.template_side not in (None, "fixed", "moving"):
            raise ValueError("template_side is 'fixed', 'moving' or None")

    @property
    def nonlinear(self) -> bool:
        return self.warp is not None

    # ----------------------------------------------------------------------------------- points
    def fixed_to_moving(self, points: np.ndarray) -> np.ndarray:
        """RAS mm points of the fixed space (N, 3) -> the same anatomy in the moving space."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        if self.warp is not None:
            x = x + _sample_field(self.warp, self.fixed, x)
        return x @ self.affine[:3, :3].T + self.affine[:3, 3]

    def moving_to_fixed(self, points: np.ndarray) -> np.ndarray:
        """RAS mm points of the moving space (N, 3) -> the same anatomy in the fixed space."""
        if self.warp is not None and self.inverse_warp is None:
            raise InputError(
                "this registration holds only the forward displacement field, and points (a tractogram, a cursor) "
                "are mapped from the moving to the fixed space with the inverse one",
                fix="Give the inverse field too (ANTs writes 1InverseWarp.nii.gz; FSL: invwarp), or register with "
                "tractlens register, which writes both",
            )
        inverse = np.linalg.inv(self.affine)
        y = np.asarray(points, dtype=np.float64).reshape(-1, 3) @ inverse[:3, :3].T + inverse[:3, 3]
        if self.inverse_warp is not None:
            y = y + _sample_field(self.inverse_warp, self.fixed, y)
        return y

    # ----------------------------------------------------------------------------------- images
    def pull_chain(self, source: Grid, reference: Grid, towards: str) -> VoxelChain:
        """The map from ``reference`` voxels to ``source`` voxels, where ``reference`` lies in the
        ``towards`` space ('fixed' or 'moving') and ``source`` in the other: composed affines, and the
        displacement field sampled where it lives."""
        to_ref = reference.affine
        from_src = np.linalg.inv(source.affine)
        if towards == "fixed":  # x (fixed) -> A (x + w(x))
            field = self.warp
            linear = from_src @ self.affine
            at_field = np.linalg.inv(self.fixed.affine) @ to_ref
            return VoxelChain(linear @ to_ref, field, at_field, linear[:3, :3])
        if self.warp is not None and self.inverse_warp is None:
            self.moving_to_fixed(np.zeros((1, 3)))  # raises the explanation
        inverse = np.linalg.inv(self.affine)  # m (moving) -> y = A⁻¹ m -> y + w⁻¹(y)
        at_field = np.linalg.inv(self.fixed.affine) @ inverse @ to_ref
        return VoxelChain(from_src @ inverse @ to_ref, self.inverse_warp, at_field, from_src[:3, :3])

    def resample_to_fixed(
        self, data: np.ndarray, reference: Grid | None = None, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on the moving grid, drawn on ``reference`` (a grid of the fixed space; the fixed
        image's by default). A 4-D array keeps its fourth axis."""
        reference = reference or self.fixed
        return resample_chain(
            data, self.moving, reference, self.pull_chain(self.moving, reference, "fixed"), interp, **kw
        )

    def resample_to_moving(
        self, data: np.ndarray, reference: Grid | None = None, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on the fixed grid, drawn on ``reference`` (a grid of the moving space)."""
        reference = reference or self.moving
        return resample_chain(
            data, self.fixed, reference, self.pull_chain(self.fixed, reference, "moving"), interp, **kw
        )

    def inverted(self) -> Registration:
        """The same registration seen from the other side (fixed and moving swapped). Only for
        linear ones: a warp lives on the fixed grid and cannot change sides exactly."""
        if self.nonlinear:
            raise ValueError("a nonlinear registration cannot be inverted: use resample_to_moving / moving_to_fixed")
        side = {"fixed": "moving", "moving": "fixed"}.get(self.template_side or "")
        return Registration(
            self.moving,
            self.fixed,
            np.linalg.inv(self.affine),
            kind=self.kind,
            fixed_name=self.moving_name,
            moving_name=self.fixed_name,
            template=self.template,
            template_side=side,
            folder=self.folder,
            metric=self.metric,
        )

    # -------------------------------------------------------------------------------- template
    def to_template(self, points: np.ndarray) -> np.ndarray:
        """Template (MNI) coordinates of subject points (the side that is not the template)."""
        if self.template_side == "fixed":
            return self.moving_to_fixed(points)
        if self.template_side == "moving":
            return self.fixed_to_moving(points)
        raise ValueError("this registration does not involve a template")

    def subject_side(self) -> str:
        """'fixed' or 'moving': the side that is the subject (not the template)."""
        if self.template_side is None:
            raise ValueError("this registration does not involve a template")
        return "moving" if self.template_side == "fixed" else "fixed"

    def template_to_subject(
        self, data: np.ndarray, template_grid: Grid, reference: Grid, interp: str = "nearest"
    ) -> np.ndarray:
        """An image on a template grid (an atlas), drawn on ``reference`` (a subject grid)."""
        if self.template_side not in ("fixed", "moving"):
            raise ValueError("this registration does not involve a template")
        towards = "moving" if self.template_side == "fixed" else "fixed"
        return resample_chain(
            data, template_grid, reference, self.pull_chain(template_grid, reference, towards), interp
        )

    def describe(self) -> str:
        """One line for reports and layer properties."""
        how = {"rigid": "rigid", "affine": "affine", "syn": "affine + SyN", "fsl": "FSL", "ants": "ANTs"}.get(
            self.kind, self.kind
        )
        metric = f" ({self.metric})" if self.metric else ""
        where = f", {self.folder}" if self.folder else ""
        return f"{how}{metric}: {self.moving_name} → {self.fixed_name}{where}"


def _sample_field(field_: np.ndarray, grid: Grid, points: np.ndarray) -> np.ndarray:
    """A displacement field on ``grid`` sampled trilinearly at RAS points (0 outside the grid)."""
    vox = grid.to_voxels(points).T
    return np.stack(
        [ndimage.map_coordinates(field_[..., c], vox, order=1, mode="constant", cval=0.0) for c in range(3)], axis=1
    )


@dataclass(frozen=True, eq=False)
class VoxelChain:
    """``source voxel = linear · r + step · field(at_field · r)`` for a reference voxel ``r``: the
    whole path from a reference grid to a source grid in two affines and one field lookup."""

    linear: np.ndarray  # 4x4: reference voxel -> source voxel (the affine part)
    field: np.ndarray | None  # (X, Y, Z, 3) RAS mm displacement, or None
    at_field: np.ndarray  # 4x4: reference voxel -> field voxel
    step: np.ndarray  # 3x3: RAS mm displacement -> source voxels


def resample_chain(
    data: np.ndarray,
    source: Grid,
    reference: Grid,
    chain: VoxelChain,
    interp: str = "linear",
    *,
    cval: float = 0.0,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Draw ``data`` (on ``source``) on ``reference`` through ``chain``. Without a field this is one
    affine resampling (no coordinate arrays); with one, the field is sampled a slab at a time."""
    if interp not in INTERPOLATIONS:
        raise ValueError(f"interpolation is one of {INTERPOLATIONS}, got {interp!r}")
    data = np.asarray(data)
    if data.shape[:3] != source.shape:
        raise ValueError(f"data of shape {data.shape[:3]} is not on the source grid {source.shape}")
    order = 1 if interp == "linear" else 0
    extra = data.shape[3:]
    flat = data.reshape(*source.shape, -1)
    out_dtype = data.dtype if order == 0 else np.result_type(data.dtype, np.float32)
    out = np.empty((*reference.shape, flat.shape[3]), dtype=out_dtype)
    for c in range(flat.shape[3]):
        channel = flat[..., c] if order == 0 else flat[..., c].astype(np.float32, copy=False)
        if chain.field is None:
            ndimage.affine_transform(channel, chain.linear[:3, :3], offset=chain.linear[:3, 3], output_shape=reference.shape,
                                     output=out[..., c], order=order, mode="constant", cval=cval, prefilter=False)  # fmt: skip
            continue
        nx, ny, nz = reference.shape
        step = max(1, SLAB_VOXELS // (ny * nz))
        for i0 in range(0, nx, step):
            if cancelled is not None and cancelled():
                raise Cancelled()
            shape = (min(nx, i0 + step) - i0, ny, nz)
            # the field where the slab's voxels land: an affine lookup, as the data's would be
            at = chain.at_field
            w = [
                ndimage.affine_transform(chain.field[..., d], at[:3, :3], offset=at[:3, 3] + at[:3, 0] * i0,
                                         output_shape=shape, order=1, mode="constant", cval=0.0)
                for d in range(3)
            ]  # fmt: skip
            i, j, k = np.meshgrid(np.arange(i0, i0 + shape[0], dtype=np.float32), np.arange(ny, dtype=np.float32),
                                  np.arange(nz, dtype=np.float32), indexing="ij", sparse=True)  # fmt: skip
            m, q = chain.linear, chain.step
            src = np.stack([
                (m[d, 0] * i + m[d, 1] * j + m[d, 2] * k + m[d, 3] + q[d, 0] * w[0] + q[d, 1] * w[1] + q[d, 2] * w[2]).ravel()
                for d in range(3)
            ])  # fmt: skip
            values = ndimage.map_coordinates(channel, src, order=order, mode="constant", cval=cval, prefilter=False)
            out[i0 : i0 + shape[0], ..., c] = values.reshape(shape)
    return out.reshape(*reference.shape, *extra)


def affine_chain(source: Grid, reference: Grid, reference_to_source: np.ndarray | None = None) -> VoxelChain:
    """The chain of an affine map (RAS -> RAS, the identity by default) between two grids."""
    linear = (
        np.linalg.inv(source.affine)
        @ (np.eye(4) if reference_to_source is None else reference_to_source)
        @ reference.affine
    )
    return VoxelChain(linear, None, np.eye(4), np.eye(3))


def resample(
    data: np.ndarray,
    source: Grid,
    reference: Grid,
    reference_to_source: Callable[[np.ndarray], np.ndarray],
    interp: str = "linear",
    *,
    cval: float = 0.0,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Draw ``data`` (on ``source``) on ``reference``: each reference voxel centre is sent to the
    source space by ``reference_to_source`` (RAS mm -> RAS mm) and interpolated there."""
    if interp not in INTERPOLATIONS:
        raise ValueError(f"interpolation is one of {INTERPOLATIONS}, got {interp!r}")
    data = np.asarray(data)
    if data.shape[:3] != source.shape:
        raise ValueError(f"data of shape {data.shape[:3]} is not on the source grid {source.shape}")
    order = 1 if interp == "linear" else 0
    extra = data.shape[3:]
    out_dtype = data.dtype if interp == "nearest" else np.result_type(data.dtype, np.float32)
    out = np.empty(reference.n_voxels * int(np.prod(extra, dtype=int)), dtype=out_dtype).reshape(-1, *extra)
    flat = data.reshape(*source.shape, -1)
    nx, ny, nz = reference.shape
    plane = ny * nz
    step = max(1, SLAB_VOXELS // plane)
    for i0 in range(0, nx, step):
        if cancelled is not None and cancelled():
            raise Cancelled()
        i1 = min(nx, i0 + step)
        ijk = np.stack(np.meshgrid(np.arange(i0, i1), np.arange(ny), np.arange(nz), indexing="ij"), -1).reshape(-1, 3)
        ras = ijk @ reference.affine[:3, :3].T + reference.affine[:3, 3]
        vox = source.to_voxels(reference_to_source(ras)).T
        for c in range(flat.shape[3]):
            channel = flat[..., c] if order == 0 else flat[..., c].astype(np.float32, copy=False)
            values = ndimage.map_coordinates(channel, vox, order=order, mode="constant", cval=cval, prefilter=False)
            out.reshape(reference.n_voxels, -1)[i0 * plane : i1 * plane, c] = values
    return out.reshape(*reference.shape, *extra)
