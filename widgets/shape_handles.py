"""The 3-D handles on shape ROIs: a sphere handle on a sphere ROI, a box handle on a box ROI.

A shape ROI lives in voxels of its grid, the handles in world millimetres: the conversions
go through the ROI's affine, axis by axis, so anisotropic voxels keep their proportions. A
handle's edit snaps to whole voxels (a sphere's centre and radius, a box's faces to voxel
boundaries), so a shape edited in 3-D is a set of voxels the slice tools could have made.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyvista as pv
from vtkmodules.vtkInteractionWidgets import vtkBoxWidget

from tractlens.app.model import Layer, normal_shape, shape_half_sizes


def new_shape_widget(plotter, layer: Layer, on_change):
    """A handle on ``layer``'s shape in ``plotter``: a sphere handle on a sphere (drag it to move
    it, right-drag to resize), a box handle on a box (drag its centre or a face; the box's
    half-sizes per axis follow). ``on_change(shape)`` gets the shape, in voxels of the ROI's
    grid, when an interaction ends (one edit per interaction)."""
    shape, affine = layer.data.shape, layer.data.affine
    if shape["kind"] == "box":
        widget = vtkBoxWidget()
        widget.SetInteractor(plotter.iren.interactor)
        widget.SetCurrentRenderer(plotter.renderer)
        widget.SetPlaceFactor(1.0)  # exactly the bounds given
        widget.SetRotationEnabled(False)  # the box stays aligned with the voxel axes
        widget.GetOutlineProperty().SetColor(*layer.color_rgb())
        widget.PlaceWidget(box_handle_bounds(shape, affine))
        widget.On()

        def box_moved(box, _event):
            poly = pv.PolyData()
            box.GetPolyData(poly)
            on_change(box_from_bounds(poly.bounds, layer.data.affine, layer.data.shape or shape))

        widget.AddObserver("EndInteractionEvent", box_moved)
        return widget
    centre, radius_mm = sphere_handle(shape, affine)

    def sphere_moved(centre_world, sphere):
        current = layer.data.shape or shape
        on_change(sphere_from_handle(centre_world, sphere.GetRadius(), layer.data.affine, current))

    return plotter.add_sphere_widget(
        sphere_moved,
        center=tuple(centre),
        radius=radius_mm,
        color=layer.color_rgb(),
        style="wireframe",
        pass_widget=True,
        test_callback=False,  # the handle must not edit the ROI by merely appearing
    )


def handle_fits(widget, layer: Layer) -> bool:
    """Is ``widget`` the kind of handle for ``layer``'s shape (a box handle on a box)?"""
    shape = layer.data.shape
    return shape is not None and isinstance(widget, vtkBoxWidget) == (shape["kind"] == "box")


def place_shape_widget(widget, layer: Layer) -> None:
    """Put a handle where its shape ROI is now."""
    shape, affine = layer.data.shape, layer.data.affine
    if isinstance(widget, vtkBoxWidget):
        widget.PlaceWidget(box_handle_bounds(shape, affine))
    else:
        centre, radius_mm = sphere_handle(shape, affine)
        widget.SetCenter(*centre)
        widget.SetRadius(radius_mm)


def remove_shape_widget(plotter, widget) -> None:
    """Take a handle (or None) off ``plotter``."""
    if isinstance(widget, vtkBoxWidget):
        widget.Off()
    elif widget is not None:
        plotter.clear_sphere_widgets()


# A shape ROI lives in voxels of its grid, the handles in world millimetres: the conversions
# go through the ROI's affine, axis by axis, so anisotropic voxels keep their proportions. A
# handle's edit snaps to whole voxels (a sphere's centre and radius, a box's faces to voxel
# boundaries), so a shape edited in 3-D is a set of voxels the slice tools could have made.
def box_handle_bounds(shape: dict, affine: np.ndarray) -> np.ndarray:
    """World bounds (xmin, xmax, ymin, ymax, zmin, zmax) of a box ROI's voxels (their outer
    faces: half-size + half a voxel either side of the centre, along each voxel axis)."""
    half = shape_half_sizes(shape) + 0.5
    corners = np.asarray(shape["centre"], dtype=float) + np.array(list(itertools.product(*zip(-half, half))))
    world = corners @ affine[:3, :3].T + affine[:3, 3]
    return np.column_stack([world.min(0), world.max(0)]).ravel()


def box_from_bounds(bounds, affine: np.ndarray, shape: dict) -> dict:
    """The box ROI of the voxels whose centres the handle's world ``bounds`` hold (faces snapped
    to voxel boundaries; the inverse of :func:`box_handle_bounds`). The half-sizes may differ
    per axis; an even number of voxels along an axis puts the centre between two voxels."""
    lo, hi = np.asarray(bounds, dtype=float).reshape(3, 2).T
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    voxels = np.linalg.solve(affine, np.column_stack([corners, np.ones(8)]).T)[:3].T
    first = np.floor(voxels.min(0) + 0.5 + 0.5)  # outer face -> first voxel inside (centre at +0.5)
    last = np.maximum(np.ceil(voxels.max(0) - 0.5 - 0.5), first)
    return normal_shape(dict(shape, centre=(first + last) / 2, radius=(last - first) / 2))


def sphere_handle(shape: dict, affine: np.ndarray) -> tuple[np.ndarray, float]:
    """World centre and radius (mm) of a sphere ROI's handle. A sphere of r voxels is an
    ellipsoid in millimetres when the voxels are anisotropic: the handle is the sphere around
    it, r × the largest voxel size (at least half a voxel, so a 1-voxel ROI has one)."""
    centre = affine[:3, :3] @ np.asarray(shape["centre"], dtype=float) + affine[:3, 3]
    return centre, max(float(shape["radius"]), 0.5) * _largest_voxel(affine)


def sphere_from_handle(centre_world, radius_mm: float, affine: np.ndarray, shape: dict) -> dict:
    """The sphere ROI of a handle at ``centre_world`` with ``radius_mm``, snapped to whole voxels
    (the inverse of :func:`sphere_handle`)."""
    centre = np.linalg.solve(affine[:3, :3], np.asarray(centre_world, dtype=float) - affine[:3, 3])
    radius = np.floor(float(radius_mm) / _largest_voxel(affine) + 0.5)
    return normal_shape(dict(shape, kind="sphere", centre=np.floor(centre + 0.5), radius=radius))


def _largest_voxel(affine: np.ndarray) -> float:
    return float(np.sqrt((affine[:3, :3] ** 2).sum(0)).max())
