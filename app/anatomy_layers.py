"""Anatomy in the document: images placed on the diffusion grid through a registration, ROIs
drawn on them at their own resolution, atlas regions as ROIs and the MNI coordinate of a point.

The registration model and the use cases are :mod:`app.registration` and :mod:`app.anatomy`;
this module holds what the window does with their results, so that it holds no computation:

* :func:`placed_layer` — an image layer shown registered. A rigid or affine registration needs
  no resampling: the layer keeps its voxels and gets the affine that puts them in the fixed
  (diffusion) space, ``inv(A) @ affine`` (``A`` maps fixed to moving points). A nonlinear one
  is resampled once (linear) onto a grid of the image's own voxel size over the fixed image's
  field of view. Either way the layer lives in fixed space at its own resolution.
* :func:`new_roi_on` and :func:`brush_voxels` — an ROI on such a layer's grid and the voxels a
  brush stroke on a slice of the reference grid paints into it (all those whose centres lie
  within the brush's disc in mm and in the slice's slab, not one per screen pixel).
* :func:`roi_on_grid` — an ROI brought onto a method's grid (nearest neighbour), which is how
  every method sees ROIs drawn on the anatomy (:mod:`app.regions`, :meth:`Document.roi_sets`).
* :func:`as_scanned` — a placed image as the scanner placed it (registering it again starts there),
  and :func:`mask_as_scanned`, a layer chosen as a registration's brain mask, alike;
  :func:`roi_following` — an ROI drawn on an image, moved with it when it is placed.
* :func:`template_registration` (a template registration of the DWI, or one of a T1 chained with
  the T1's registration to the DWI), :func:`mni_coordinate`, :func:`atlas_region_layer`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InputError
from .grid import Grid, same_field_of_view
from .layers import Layer, next_roi_colour
from .registration import compose_registrations
from .volumes import RoiMask, Volume

REGISTRATION_KEY = "registration"  # the provenance entry of a layer placed by a registration


def registration_record(registration, registration_id: str) -> dict:
    """What a layer's provenance says of the registration that placed it (reports, sessions,
    the layer's properties): its id in the document, its one-line description and kind."""
    return {
        "id": registration_id,
        "describe": registration.describe(),
        "kind": registration.kind,
        "fixed": registration.fixed_name,
        "moving": registration.moving_name,
        "folder": registration.folder,
    }


def placed_by(layer: Layer) -> str | None:
    """The one-line description of the registration that placed ``layer`` (None: scanner
    coordinates only)."""
    record = layer.provenance.get(REGISTRATION_KEY)
    return record.get("describe") if isinstance(record, dict) else None


def fine_grid(reference: Grid, voxel_mm: np.ndarray) -> Grid:
    """A grid over ``reference``'s field of view (same axes) with voxels of ``voxel_mm``
    (the image's own resolution), its first voxel in the corner of ``reference``'s first."""
    reference = Grid.of(reference)
    coarse = reference.voxel_sizes
    fine = np.broadcast_to(np.asarray(voxel_mm, dtype=np.float64), (3,))
    scale = fine / coarse
    affine = np.array(reference.affine, dtype=np.float64)
    affine[:3, :3] = affine[:3, :3] * scale[None, :]
    corner = -0.5 + 0.5 * scale  # the fine voxel centre nearest the coarse grid's corner, in coarse voxels
    affine[:3, 3] = reference.affine[:3, :3] @ corner + reference.affine[:3, 3]
    shape = tuple(int(n) for n in np.maximum(1, np.floor(np.array(reference.shape) / scale + 1e-6)))
    return Grid(affine, shape)


def overlaps(a: Any, b: Any) -> bool:
    """Do two grids' fields of view share any space?"""

    def box(grid: Grid) -> np.ndarray:
        corners = np.array([[i, j, k] for i in (-0.5, grid.shape[0] - 0.5) for j in (-0.5, grid.shape[1] - 0.5)
                            for k in (-0.5, grid.shape[2] - 0.5)])  # fmt: skip
        mm = grid.to_mm(corners)
        return np.array([mm.min(0), mm.max(0)])

    first, second = box(Grid.of(a)), box(Grid.of(b))
    return bool(np.all(first[0] < second[1]) and np.all(second[0] < first[1]))


def placed_volume(volume: Volume, registration, reference: Any, *, interp: str = "linear") -> Volume:
    """``volume`` (in ``registration``'s moving space: the moving image itself, or another image
    of that space, e.g. an fMRI map in the T1's) in fixed space, at its own resolution (see the
    module docstring). ``reference``: the fixed (diffusion) grid, for a nonlinear one. An image
    that shares no space with the moving image is refused (ValueError)."""
    grid = Grid.of(volume)
    if not overlaps(grid, registration.moving):
        raise InputError(
            f"{volume.name} lies outside the space this registration moves ({registration.moving_name})",
            fix="Register it, or choose the registration made for its series",
        )
    if registration.warp is None:  # exact: the same voxels, another placement
        affine = np.linalg.solve(np.asarray(registration.affine, np.float64), np.asarray(volume.affine, np.float64))
        out = Volume(volume.name, volume.data, affine, kind=volume.kind, source=volume.source)
    else:
        from .registration import resample

        target = fine_grid(Grid.of(reference), grid.voxel_sizes)
        data = resample(np.asarray(volume.data), grid, target, registration.fixed_to_moving, interp)
        out = Volume(
            volume.name, np.asarray(data, dtype=np.float32), target.affine, kind=volume.kind, source=volume.source
        )
    out.lut = volume.lut
    return out


def placed_layer(
    layer: Layer, registration, registration_id: str, reference: Any, volume: Volume | None = None
) -> Layer:
    """A new layer: ``layer`` shown registered (:func:`placed_volume` of ``volume``, by default
    the layer's own: the image as the scanner placed it), with its display and provenance, the
    provenance naming the registration (:func:`registration_record`). Put it in the layer's
    place with :meth:`Document.replace_layer`."""
    volume = layer.data if volume is None else volume
    interp = "nearest" if layer.kind == "labels" else "linear"
    placed = placed_volume(volume, registration, reference, interp=interp)
    new = Layer(layer.name, placed, layer.kind)
    for key in Layer._DISPLAY:
        setattr(new, key, getattr(layer, key))
    new.provenance = dict(layer.provenance)
    new.provenance["scanner_affine"] = np.asarray(volume.affine).tolist()
    new.provenance[REGISTRATION_KEY] = registration_record(registration, registration_id)
    return new


def as_scanned(layer: Layer) -> Volume:
    """The image of ``layer`` as the scanner placed it: itself, or, for a layer placed by a
    registration, the image before (kept while the window runs; after a session is reopened,
    rebuilt from the scanner's affine the provenance keeps, for a linear placement)."""
    kept = getattr(layer.data, "unplaced", None)
    if kept is not None:
        return kept
    record = layer.provenance.get(REGISTRATION_KEY)
    scanner = layer.provenance.get("scanner_affine")
    if isinstance(record, dict) and record.get("kind") != "syn" and scanner is not None:
        data = layer.data
        volume = Volume(data.name, data.data, np.asarray(scanner, dtype=np.float64), kind=data.kind, source=data.source)
        volume.lut = data.lut
        return volume
    return layer.data


def mask_as_scanned(layer: Layer) -> RoiMask | Volume:
    """A layer chosen as a brain mask of a registration (Image ▸ Register…), in the space its image
    was scanned in, as :func:`app.anatomy.register_images` takes it: an ROI drawn on an image placed
    by a linear registration with that image's scanner affine (its voxels unchanged), any other ROI
    as it is (a copy: painting goes on while the registration runs), an image as scanned."""
    if layer.kind != "roi":
        return as_scanned(layer)
    scanner = layer.provenance.get("scanner_affine")
    affine = layer.data.affine if scanner is None else np.asarray(scanner, dtype=np.float64)
    return RoiMask(layer.name, np.array(layer.data.mask, dtype=bool), affine, role=layer.data.role)


def new_roi_on(layer: Layer, name: str, role: str, layers=()) -> Layer:
    """An empty ROI on ``layer``'s grid (its own resolution), coloured apart from ``layers``;
    its provenance names the layer and the registration that placed it."""
    grid = Grid.of(layer.data)
    roi = Layer(name, RoiMask(name, np.zeros(grid.shape, dtype=bool), grid.affine, role=role), "roi")
    roi.color = next_roi_colour(layers, role)
    roi.provenance = {"drawn_on": layer.name}
    if REGISTRATION_KEY in layer.provenance:
        roi.provenance[REGISTRATION_KEY] = dict(layer.provenance[REGISTRATION_KEY])
        if layer.provenance[REGISTRATION_KEY].get("kind") != "syn" and "scanner_affine" in layer.provenance:
            roi.provenance["scanner_affine"] = layer.provenance["scanner_affine"]  # the same voxels, unmoved
    return roi


def roi_following(roi: Layer, old: Layer, new: Layer, registration, reference: Any) -> Layer | None:
    """An ROI drawn on image layer ``old`` (on its grid), placed as ``old`` was just placed as
    ``new`` through ``registration``, so that a lesion drawn before the registration stays on the
    anatomy it was drawn on: a new ROI layer for :meth:`Document.replace_layer` (same display;
    moved without resampling by a linear registration, else resampled nearest-neighbour), or
    None when ``roi`` was not drawn on ``old`` or its scan is not known."""
    if roi.kind != "roi" or roi.provenance.get("drawn_on") != old.name:
        return None
    if not Grid.of(roi.data).matches(Grid.of(old.data)):
        return None
    scanner = roi.provenance.get("scanner_affine")
    if scanner is None and REGISTRATION_KEY not in roi.provenance:
        scanner = roi.data.affine  # drawn on the image as the scanner placed it
    if scanner is None:
        return None
    scan = Volume(roi.name, roi.data.mask.astype(np.uint8), np.asarray(scanner, dtype=np.float64))
    placed = placed_volume(scan, registration, reference, interp="nearest")
    mask = RoiMask(roi.name, np.asarray(placed.data) > 0, placed.affine, role=roi.data.role)
    out = Layer(roi.name, mask, "roi")
    for key in Layer._DISPLAY:
        setattr(out, key, getattr(roi, key))
    out.provenance = dict(roi.provenance, drawn_on=new.name)
    out.provenance[REGISTRATION_KEY] = dict(new.provenance[REGISTRATION_KEY])
    out.provenance.pop("scanner_affine", None)
    if registration.warp is None:
        out.provenance["scanner_affine"] = np.asarray(scanner, dtype=np.float64).tolist()
    return out


def roi_in_scanner_space(layer: Layer) -> tuple[np.ndarray, np.ndarray]:
    """An ROI drawn on an image placed by a linear registration, as (mask, affine) in that
    image's scanner space (e.g. the lesion drawn on the T1, for the T1's planning software):
    the same voxels with the image's own affine. :class:`InputError` for any other ROI."""
    scanner = layer.provenance.get("scanner_affine") if layer.kind == "roi" else None
    if scanner is None:
        raise InputError(
            f"{layer.name} was not drawn on an image placed by a (linear) registration, so it has no other space",
            fix="Save it with File ▸ Save ROI… (it lies in the diffusion data's space)",
        )
    return np.asarray(layer.data.mask), np.asarray(scanner, dtype=np.float64)


def roi_on_grid(mask: np.ndarray, affine: np.ndarray, grid: Any) -> np.ndarray:
    """An ROI mask (on the grid ``affine``, ``mask.shape``) on ``grid`` by nearest neighbour
    (the mask itself when the grids match)."""
    return Grid.of(grid).resample_nearest(np.asarray(mask, dtype=bool), Grid(affine, np.shape(mask)))


def brush_voxels(
    roi_grid: Any, reference: Any, centres: np.ndarray, radius_voxels: float, normal_axis: int
) -> np.ndarray:
    """(N, 3) voxels of an ROI on ``roi_grid`` that a brush stroke on a slice of the
    ``reference`` grid paints: those whose centres lie on the slice (their nearest reference
    voxel across the plane is the slice's) and within ``radius_voxels`` reference voxels (in mm,
    at least half a reference voxel: one click paints the voxel under it) of a stroke centre
    (``centres``: reference voxel coordinates, (M, 3)) in the plane."""
    roi_grid, reference = Grid.of(roi_grid), Grid.of(reference)
    centres = np.atleast_2d(np.asarray(centres, dtype=np.float64))
    sizes = reference.voxel_sizes
    in_plane = [axis for axis in range(3) if axis != normal_axis]
    radius_mm = max(float(radius_voxels) * float(sizes[in_plane].min()), 0.5 * float(sizes[in_plane].max()))
    reach = radius_mm / sizes + 1.0  # reference voxels around the centres that may hold painted voxels
    lo = np.floor(centres.min(0) - reach) - 0.5
    hi = np.ceil(centres.max(0) + reach) + 0.5
    lo[normal_axis], hi[normal_axis] = centres[0, normal_axis] - 0.5, centres[0, normal_axis] + 0.5
    corners = np.array([[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])])
    roi_corners = roi_grid.to_voxels(reference.to_mm(corners))
    first = np.maximum(np.floor(roi_corners.min(0)).astype(int), 0)
    last = np.minimum(np.ceil(roi_corners.max(0)).astype(int), np.array(roi_grid.shape) - 1)
    if np.any(last < first):
        return np.zeros((0, 3), dtype=np.int64)
    axes = [np.arange(first[a], last[a] + 1) for a in range(3)]
    candidates = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    in_reference = reference.to_voxels(roi_grid.to_mm(candidates))
    on_slice = np.rint(in_reference[:, normal_axis]) == np.rint(centres[0, normal_axis])
    keep = np.zeros(len(candidates), dtype=bool)
    for centre in centres:
        offset_mm = (in_reference - centre)[:, in_plane] * sizes[in_plane]
        keep |= (offset_mm**2).sum(1) <= radius_mm**2 + 1e-9
    return candidates[keep & on_slice].astype(np.int64)


def covering_voxels(roi_grid: Any, reference: Any, voxels: np.ndarray) -> np.ndarray:
    """(N, 3) voxels of an ROI on ``roi_grid`` whose centres lie in the given reference voxels
    (a rectangle, a polygon or a flood fill drawn on the reference grid), at least the nearest
    one of each (a finer reference grid)."""
    roi_grid, reference = Grid.of(roi_grid), Grid.of(reference)
    voxels = np.asarray(voxels, dtype=np.int64).reshape(-1, 3)
    if len(voxels) == 0:
        return voxels
    nearest = np.rint(roi_grid.to_voxels(reference.to_mm(voxels))).astype(np.int64)
    lo = np.maximum(np.floor(roi_grid.to_voxels(reference.to_mm(voxels.min(0) - 0.5))).astype(int), 0)
    hi = np.minimum(np.ceil(roi_grid.to_voxels(reference.to_mm(voxels.max(0) + 0.5))).astype(int), roi_grid.shape)
    lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
    axes = [np.arange(lo[a], hi[a] + 1) for a in range(3)]
    candidates = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    back = np.rint(reference.to_voxels(roi_grid.to_mm(candidates))).astype(np.int64)
    wanted = {tuple(v) for v in voxels.tolist()}
    inside = np.array([tuple(v) in wanted for v in back.tolist()], dtype=bool) if len(back) else np.zeros(0, bool)
    out = np.concatenate([candidates[inside], nearest])
    keep = np.all((out >= 0) & (out < np.array(roi_grid.shape)), axis=1)
    return np.unique(out[keep], axis=0)


def subject_grid(registration) -> Grid:
    """The grid of a template registration's subject side (the image that is not the template)."""
    return registration.moving if registration.template_side == "fixed" else registration.fixed


def template_registration(registrations, reference: Any = None) -> Any | None:
    """The newest registration of ``registrations`` whose one side is a template (MNI), or None;
    with ``reference``, one whose subject side is that grid's space (made from the DWI, not from a
    T1 in its own scanner space, which would place the atlas off by the head's motion between the
    series) or, failing that, a chain (:func:`app.registration.compose_registrations`) of a
    template registration of another image (the T1) and a registration of that image with the
    DWI: MNI → T1 → DWI."""
    registrations = list(registrations)
    templates = [r for r in reversed(registrations) if getattr(r, "template", None)]
    for registration in templates:
        if reference is None or same_field_of_view(subject_grid(registration), reference):
            return registration
    for registration in templates:
        subject = subject_grid(registration)
        for bridge in reversed(registrations):
            if getattr(bridge, "template", None):
                continue
            if any(
                same_field_of_view(getattr(bridge, near), reference)
                and same_field_of_view(getattr(bridge, far), subject)
                for near, far in (("fixed", "moving"), ("moving", "fixed"))
            ):
                try:
                    return compose_registrations([registration, bridge])  # data flows MNI → T1 → DWI
                except InputError:
                    continue  # the two meet at more than one image: not a chain to trust
    return None


def mni_coordinate(registration, world_mm) -> np.ndarray | None:
    """The template (MNI) coordinate (mm) of a subject point (RAS mm of the subject side of
    ``registration``); None when ``registration`` has no template side."""
    if registration is None or not getattr(registration, "template", None):
        return None
    return registration.to_template(np.asarray(world_mm, dtype=np.float64).reshape(1, 3))[0]


def atlas_region_layer(atlas: str, registration, reference: Any, value: int, region: str, layers=()) -> Layer:
    """An atlas region brought to the subject through a template registration, as an ROI layer
    on ``reference`` (the diffusion grid), named after the region; :class:`InputError` (from
    :func:`app.anatomy.atlas_region_mask`) when it does not reach the image."""
    from .anatomy import atlas_region_mask

    grid = Grid.of(reference)
    mask = np.asarray(atlas_region_mask(atlas, registration, grid, int(value)), dtype=bool)
    taken = {layer.name for layer in layers}
    name, number = region, 1
    while name in taken:
        number += 1
        name = f"{region} ({number})"
    roi = Layer(name, RoiMask(name, mask, grid.affine, role="target"), "roi")
    roi.color = next_roi_colour(layers, "target")
    roi.provenance = {
        "atlas": atlas,
        "region": region,
        "label": int(value),
        REGISTRATION_KEY: {"describe": registration.describe(), "kind": registration.kind},
    }
    return roi
