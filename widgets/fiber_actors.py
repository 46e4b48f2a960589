"""Tractogram actors of the 3-D view: switching an actor between its level-of-detail meshes, and
the 2-D views' colour maps as VTK lookup tables so that both kinds of view colour fibres alike."""

from __future__ import annotations

import numpy as np
import pyvista as pv

from tractlens.app.colormaps import LUTS


def fiber_mesh(points: np.ndarray, offsets: np.ndarray, connectivity: np.ndarray, point_data: dict) -> pv.PolyData:
    """Polylines over ``points`` with per-point arrays. VTK arrays cannot be empty, so a
    tractogram without points (0 streamlines: an ordinary result) gets one placeholder point
    and no line: its actor exists, takes colourings like any other and draws nothing (the
    view keeps it hidden, see :func:`draws_nothing`)."""
    if len(points) == 0:
        mesh = pv.PolyData(np.zeros((1, 3), np.float32))
        for key, values in point_data.items():
            values = np.asarray(values)
            mesh.point_data[key] = np.zeros((1, *values.shape[1:]), values.dtype)
        return mesh
    mesh = pv.PolyData(points, lines=pv.CellArray.from_arrays(offsets, connectivity))
    for key, values in point_data.items():
        mesh.point_data[key] = values
    return mesh


def draws_nothing(layer) -> bool:
    """A tractogram without points: its actor stays hidden (out of the camera's bounds too)."""
    return len(layer.data.points) == 0


def show_mesh(entry: dict, mesh: pv.PolyData):
    """Give the tractogram's actor another level-of-detail mesh, coloured by the same array
    (each mesh has its own active scalars: without this the other level would show its first
    array, the direction colours)."""
    name = entry["colour"][0]
    if name in mesh.point_data:
        mesh.set_active_scalars(name)
    mapper = entry["actor"].GetMapper()
    mapper.SetInputData(mesh)
    return mapper


def solid_actor(plotter, mesh: pv.PolyData, colour: str | None, name: str, **options):
    """A tractogram's actor in one colour (``color_by="solid"``: a named bundle's), the meshes'
    direction colours not drawn."""
    actor = plotter.add_mesh(mesh, color=colour or "white", name=name, show_scalar_bar=False, line_width=1, **options)
    actor.GetMapper().ScalarVisibilityOff()
    return actor


def lookup_table(name: str, clim: tuple[float, float]) -> pv.LookupTable:
    """The 2-D views' colour map as a VTK lookup table over ``clim``, so both views agree."""
    rgb = LUTS.get(name, LUTS["viridis"])
    rgba = np.concatenate([rgb, np.ones((len(rgb), 1))], axis=1)
    lut = pv.LookupTable(values=(rgba * 255).astype(np.uint8))
    lut.scalar_range = clim
    return lut
