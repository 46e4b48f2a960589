"""Tractogram actors of the 3-D view: switching an actor between its level-of-detail meshes, and
the 2-D views' colour maps as VTK lookup tables so that both kinds of view colour fibres alike."""

from __future__ import annotations

import numpy as np
import pyvista as pv

from .render import LUTS


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


def lookup_table(name: str, clim: tuple[float, float]) -> pv.LookupTable:
    """The 2-D views' colour map as a VTK lookup table over ``clim``, so both views agree."""
    rgb = LUTS.get(name, LUTS["viridis"])
    rgba = np.concatenate([rgb, np.ones((len(rgb), 1))], axis=1)
    lut = pv.LookupTable(values=(rgba * 255).astype(np.uint8))
    lut.scalar_range = clim
    return lut
