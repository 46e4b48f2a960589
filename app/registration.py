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
resampled with trilinear or nearest-neighbour interpolation by the engine (:mod:`tractlens.gpu.resample`:
SciPy's ``map_coordinates`` edges, NumPy or numba's compiled loop on the CPU's threads, or CuPy), one slab of
reference voxels at a time so a 1 mm whole-brain grid never holds all its coordinates at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tractlens.gpu.backend import Cancelled

from .errors import InputError
from .grid import Grid, same_field_of_view

KINDS = ("identity", "rigid", "affine", "syn", "fsl", "ants")
INTERPOLATIONS = ("linear", "nearest")

#: Reference voxels resampled per slab (three float64 coordinates each: ~48 MB).
SLAB_VOXELS = 2_000_000


class _Sides:
    """What a registration and a chain of them (:class:`ChainedRegistration`) share: images drawn
    from one side onto the other, and the template side. Needs ``fixed``, ``moving`` (grids),
    ``template_side``, ``fixed_to_moving``, ``moving_to_fixed`` and :meth:`pull`."""

    def resample_to_fixed(
        self, data: np.ndarray, reference: Grid | None = None, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on the moving grid, drawn on ``reference`` (a grid of the fixed space; the fixed
        image's by default). A 4-D array keeps its fourth axis."""
        return self.pull(data, self.moving, reference or self.fixed, "fixed", interp, **kw)

    def resample_to_moving(
        self, data: np.ndarray, reference: Grid | None = None, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on the fixed grid, drawn on ``reference`` (a grid of the moving space)."""
        return self.pull(data, self.fixed, reference or self.moving, "moving", interp, **kw)

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
        self, data: np.ndarray, template_grid: Grid, reference: Grid, interp: str = "nearest", **kw
    ) -> np.ndarray:
        """An image on a template grid (an atlas), drawn on ``reference`` (a subject grid); ``kw`` as
        :meth:`pull` takes them (``device``, ``cancelled``)."""
        if self.template_side not in ("fixed", "moving"):
            raise ValueError("this registration does not involve a template")
        return self.pull(data, template_grid, reference, self.subject_side(), interp, **kw)


@dataclass(frozen=True, eq=False)
class Registration(_Sides):
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

    def pull(
        self, data: np.ndarray, source: Grid, reference: Grid, towards: str, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on ``source`` (a grid of the other side) drawn on ``reference``, a grid of the
        ``towards`` side ('fixed' or 'moving'), through :meth:`pull_chain`."""
        return resample_chain(data, source, reference, self.pull_chain(source, reference, towards), interp, **kw)

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

    def describe(self) -> str:
        """One line for reports and layer properties."""
        how = {"rigid": "rigid", "affine": "affine", "syn": "affine + SyN", "fsl": "FSL", "ants": "ANTs"}.get(
            self.kind, self.kind
        )
        metric = f" ({self.metric})" if self.metric else ""
        where = f", {self.folder}" if self.folder else ""
        return f"{how}{metric}: {self.moving_name} → {self.fixed_name}{where}"


#: Which way a registration is walked in a chain: from its moving to its fixed space, or back.
MOVING_TO_FIXED, FIXED_TO_MOVING = "moving→fixed", "fixed→moving"
_OTHER = {"fixed": "moving", "moving": "fixed"}


@dataclass(frozen=True, eq=False)
class ChainedRegistration(_Sides):
    """Registrations joined end to end through the images they share: T1 → DWI and T1 → MNI give
    DWI ↔ MNI through the T1, so atlas regions and MNI coordinates reach the DWI of a patient whose
    T1 was registered to the template (:func:`compose_registrations` builds one).

    ``legs`` are (registration, way) in the order data flows forward: the chain's *moving* space is
    where the first leg starts, its *fixed* space where the last one ends, so a chain of one is
    the registration itself and ``moving_to_fixed`` maps points forward, leg after leg (each warp
    included: a nonlinear leg maps points through its own fields), and ``fixed_to_moving`` back.
    Images are pulled point by point (:func:`resample`): the legs' fields live on different grids
    and do not compose into one :class:`VoxelChain`. Each leg keeps its own checks (a nonlinear one
    without its inverse field refuses to push points the way that needs it).
    """

    legs: tuple[tuple[Registration, str], ...]

    def __post_init__(self):
        if len(self.legs) < 2:
            raise ValueError("a chain joins at least two registrations")
        for registration, way in self.legs:
            if not isinstance(registration, Registration) or way not in (MOVING_TO_FIXED, FIXED_TO_MOVING):
                raise ValueError("a chain's legs are (Registration, MOVING_TO_FIXED or FIXED_TO_MOVING)")

    # the sides: where the first leg starts (moving) and the last one ends (fixed)
    def _start(self) -> tuple[Registration, str]:
        registration, way = self.legs[0]
        return registration, "moving" if way == MOVING_TO_FIXED else "fixed"

    def _end(self) -> tuple[Registration, str]:
        registration, way = self.legs[-1]
        return registration, "fixed" if way == MOVING_TO_FIXED else "moving"

    @property
    def moving(self) -> Grid:
        registration, side = self._start()
        return getattr(registration, side)

    @property
    def fixed(self) -> Grid:
        registration, side = self._end()
        return getattr(registration, side)

    @property
    def moving_name(self) -> str:
        registration, side = self._start()
        return getattr(registration, f"{side}_name")

    @property
    def fixed_name(self) -> str:
        registration, side = self._end()
        return getattr(registration, f"{side}_name")

    @property
    def template_side(self) -> str | None:
        for chain_side, (registration, side) in (("fixed", self._end()), ("moving", self._start())):
            if registration.template_side == side:
                return chain_side
        return None

    @property
    def template(self) -> str | None:
        side = self.template_side
        return None if side is None else (self._end() if side == "fixed" else self._start())[0].template

    kind = "chain"
    folder = None
    metric = ""

    @property
    def nonlinear(self) -> bool:
        return any(registration.nonlinear for registration, _ in self.legs)

    # ----------------------------------------------------------------------------------- points
    def moving_to_fixed(self, points: np.ndarray) -> np.ndarray:
        """RAS mm points of the chain's moving space -> its fixed space, leg after leg."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        for registration, way in self.legs:
            x = registration.moving_to_fixed(x) if way == MOVING_TO_FIXED else registration.fixed_to_moving(x)
        return x

    def fixed_to_moving(self, points: np.ndarray) -> np.ndarray:
        """RAS mm points of the chain's fixed space -> its moving space, the legs walked back."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        for registration, way in reversed(self.legs):
            x = registration.fixed_to_moving(x) if way == MOVING_TO_FIXED else registration.moving_to_fixed(x)
        return x

    # ----------------------------------------------------------------------------------- images
    def pull(
        self, data: np.ndarray, source: Grid, reference: Grid, towards: str, interp: str = "linear", **kw
    ) -> np.ndarray:
        """``data`` on ``source`` (a grid of the other side) drawn on ``reference`` (a grid of the
        ``towards`` side): each reference voxel centre mapped through every leg."""
        if towards not in ("fixed", "moving"):
            raise ValueError("towards is 'fixed' or 'moving'")
        to_source = self.fixed_to_moving if towards == "fixed" else self.moving_to_fixed
        return resample(data, source, reference, to_source, interp, **kw)

    def inverted(self) -> ChainedRegistration:
        """The same chain walked the other way (exact: every leg maps both ways)."""
        flip = {MOVING_TO_FIXED: FIXED_TO_MOVING, FIXED_TO_MOVING: MOVING_TO_FIXED}
        return ChainedRegistration(tuple((registration, flip[way]) for registration, way in reversed(self.legs)))

    def describe(self) -> str:
        """The images passed through, then each registration: ``MNI → T1w → dwi_b0 (through …)``."""
        names = [self.moving_name]
        for registration, way in self.legs:
            names.append(registration.fixed_name if way == MOVING_TO_FIXED else registration.moving_name)
        return f"{' → '.join(names)} (through {'; '.join(registration.describe() for registration, _ in self.legs)})"


def compose_registrations(registrations) -> Registration | ChainedRegistration:
    """Registrations joined in the order given, each sharing an image with the next (its grid's
    field of view: :func:`app.grid.same_field_of_view`), as one: data flows from the side of the
    first that the second does not share, through each, to the side of the last that the one
    before does not share. One registration is returned as it is. :class:`InputError` when two
    neighbours share no image (or both: composing them would go back where it started)."""
    registrations = list(registrations)
    if not registrations:
        raise ValueError("no registration to compose")
    if len(registrations) == 1:
        return registrations[0]
    shared = [_shared_side(a, b) for a, b in itertools.pairwise(registrations)]
    legs = []
    for i, registration in enumerate(registrations):
        leaves = shared[i][0] if i < len(shared) else _OTHER[shared[i - 1][1]]
        enters = shared[i - 1][1] if i > 0 else _OTHER[leaves]
        if enters == leaves:
            raise InputError(
                f"the registration {registration.describe()} would be left by the image it is entered by",
                fix="Give the registrations in the order of the images they join (A ↔ B, then B ↔ C)",
            )
        legs.append((registration, MOVING_TO_FIXED if leaves == "fixed" else FIXED_TO_MOVING))
    return ChainedRegistration(tuple(legs))


def _shared_side(a: Registration, b: Registration) -> tuple[str, str]:
    """(side of ``a``, side of ``b``) that are the same image: the same field of view (a registration
    keeps its working grids, resampled over each image's), and the same name where that is not enough."""
    found = [
        (side_a, side_b)
        for side_a in ("fixed", "moving")
        for side_b in ("fixed", "moving")
        if same_field_of_view(getattr(a, side_a), getattr(b, side_b))
    ]
    if len(found) > 1:  # two images of one field of view (a T1 and a DWI both 240 mm wide): by name too
        named = [(sa, sb) for sa, sb in found if getattr(a, f"{sa}_name") == getattr(b, f"{sb}_name")]
        found = named if len(named) == 1 else found
    if len(found) != 1:
        why = "share no image" if not found else "join the same two images"
        raise InputError(
            f"the registrations {a.describe()} and {b.describe()} {why}, so they cannot be chained",
            fix="Chain registrations that meet at one image: e.g. T1 → DWI and T1 → MNI (tractlens register "
            "T1 DWI and tractlens register T1 mni) meet at the T1",
        )
    return found[0]


def _sample_field(field_: np.ndarray, grid: Grid, points: np.ndarray) -> np.ndarray:
    """A displacement field on ``grid`` sampled trilinearly at RAS points (0 outside the grid)."""
    from tractlens.gpu.resample import sample

    vox = grid.to_voxels(points).T
    return np.stack([sample(np, field_[..., c], vox, 1, 0.0) for c in range(3)], axis=1)


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
    device: str = "cpu",
) -> np.ndarray:
    """Draw ``data`` (on ``source``) on ``reference`` through ``chain``: every reference voxel mapped
    by two affines and one field lookup (:func:`tractlens.gpu.resample.resample_volume`), on
    ``device`` ('cpu': threads over slabs of planes; 'gpu' or 'auto': CuPy when a GPU is usable).
    SciPy's ``map_coordinates`` edges (``mode="constant"``): voxels mapped outside ``source`` get
    ``cval``."""
    if interp not in INTERPOLATIONS:
        raise ValueError(f"interpolation is one of {INTERPOLATIONS}, got {interp!r}")
    data = np.asarray(data)
    if data.shape[:3] != source.shape:
        raise ValueError(f"data of shape {data.shape[:3]} is not on the source grid {source.shape}")
    from tractlens.gpu.resample import resample_volume  # the engine's resampler, imported when first used

    return resample_volume(
        data, reference.shape, chain.linear, chain.field, chain.at_field, chain.step,
        order=1 if interp == "linear" else 0, cval=cval, device=device, cancelled=cancelled,
    )  # fmt: skip


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
    device: str = "cpu",
) -> np.ndarray:
    """Draw ``data`` (on ``source``) on ``reference``: each reference voxel centre is sent to the
    source space by ``reference_to_source`` (RAS mm -> RAS mm, NumPy) and interpolated there, a slab
    of planes at a time on the CPU's threads (``device`` is accepted for :meth:`pull`'s sake: a
    point map runs on the CPU). SciPy's ``map_coordinates`` edges: voxels mapped outside get ``cval``."""
    from tractlens.gpu.host import host_threads, run_parallel
    from tractlens.gpu.resample import sample

    if interp not in INTERPOLATIONS:
        raise ValueError(f"interpolation is one of {INTERPOLATIONS}, got {interp!r}")
    data = np.asarray(data)
    if data.shape[:3] != source.shape:
        raise ValueError(f"data of shape {data.shape[:3]} is not on the source grid {source.shape}")
    order = 1 if interp == "linear" else 0
    extra = data.shape[3:]
    out_dtype = data.dtype if interp == "nearest" else np.result_type(data.dtype, np.float32)
    flat = data.reshape(*source.shape, -1)
    if order == 1:
        flat = flat.astype(out_dtype, copy=False)
    out = np.empty((*reference.shape, flat.shape[3]), dtype=out_dtype)
    nx, ny, nz = reference.shape
    step = max(1, min(SLAB_VOXELS // (ny * nz), -(-nx // (4 * host_threads()))))

    def slab(i0: int):
        def run():
            if cancelled is not None and cancelled():
                raise Cancelled()
            i1 = min(nx, i0 + step)
            ijk = np.stack(np.meshgrid(np.arange(i0, i1), np.arange(ny), np.arange(nz), indexing="ij"), -1)
            ras = ijk.reshape(-1, 3) @ reference.affine[:3, :3].T + reference.affine[:3, 3]
            vox = source.to_voxels(reference_to_source(ras)).T
            for c in range(flat.shape[3]):
                values = sample(np, flat[..., c], vox, order, cval)
                out[i0:i1, ..., c] = values.reshape(i1 - i0, ny, nz)

        return run

    run_parallel([slab(i0) for i0 in range(0, nx, step)], host_threads())
    return out.reshape(*reference.shape, *extra)
