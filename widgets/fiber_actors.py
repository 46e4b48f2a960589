"""Tractogram actors of the 3-D view: one vertex buffer per tractogram, index ranges per level.

A :class:`FiberActors` wraps the tractogram's float32 points in ONE ``vtkPoints`` without copying
them (``numpy_to_vtk(deep=False)``) and gives every level of detail its own ``vtkPolyData`` that
shares those points and the colour arrays, differing only in its ``vtkCellArray`` (offsets +
connectivity over the points, also wrapped without copy). VTK keeps one vertex buffer per data
array per render window, so the points go to the GPU once, whichever level is drawn; changing
the level or the selection re-sends only the indices. Two actors show it: ``actor`` at rest and
``moving`` while the camera moves (a visibility switch, nothing rebuilt). Both carry the
tractogram's voxel -> RAS affine as their user matrix (the points stay in voxel coordinates).
Colouring sets the mappers' colour array and lookup table: RGBA direction colours drawn as they
are, a per-point scalar or a per-streamline scalar (cell colours) through the 2-D views' colour
map; the points are never touched.
"""

from __future__ import annotations

import numpy as np
import pyvista as pv
from vtkmodules.util.numpy_support import numpy_to_vtk
from vtkmodules.vtkCommonCore import vtkAffineArray, vtkPoints
from vtkmodules.vtkCommonDataModel import vtkCellArray, vtkPolyData
from vtkmodules.vtkCommonMath import vtkMatrix4x4
from vtkmodules.vtkRenderingCore import vtkActor, vtkPolyDataMapper

from tractlens.app.colormaps import LUTS
from tractlens.app.fiber_arrays import Cells, FiberArrays


def lookup_table(name: str, clim: tuple[float, float]) -> pv.LookupTable:
    """The 2-D views' colour map as a VTK lookup table over ``clim``, so both views agree."""
    rgb = LUTS.get(name, LUTS["viridis"])
    rgba = np.concatenate([rgb, np.ones((len(rgb), 1))], axis=1)
    lut = pv.LookupTable(values=(rgba * 255).astype(np.uint8))
    lut.scalar_range = clim
    return lut


def draws_nothing(layer) -> bool:
    """A tractogram without points: its actor stays hidden (out of the camera's bounds too)."""
    return len(layer.data.points) == 0


def vtk_array(values: np.ndarray, name: str | None = None):
    """A VTK array over ``values`` (C-contiguous), sharing its memory."""
    array = numpy_to_vtk(values, deep=False)
    if name:
        array.SetName(name)
    return array


def cell_array(cells: Cells) -> vtkCellArray:
    """Polylines from offsets + connectivity (both int32 or both int64), no copy and no loop; the
    identity connectivity as VTK's implicit ``vtkAffineArray`` (VTK's cell array takes any array)."""
    out = vtkCellArray()
    offsets = np.ascontiguousarray(cells.offsets)
    if cells.connectivity is None:  # every point in order: an implicit array, nothing stored
        connectivity = vtkAffineArray[str(offsets.dtype)]()
        connectivity.ConstructBackend(1, 0)
        connectivity.SetNumberOfComponents(1)
        connectivity.SetNumberOfTuples(cells.n_points)
    else:
        connectivity = vtk_array(cells.connectivity)
    if not out.SetData(vtk_array(offsets), connectivity):
        raise ValueError("VTK refused the cell arrays")
    return out


class FiberActors:
    """The 3-D actors of one tractogram (see the module's description)."""

    def __init__(self, arrays: FiberArrays):
        self.actor, self.moving = vtkActor(), vtkActor()
        for actor in (self.actor, self.moving):
            actor.SetMapper(vtkPolyDataMapper())
            actor.PickableOff()
        self.moving.VisibilityOff()
        self.visible = True
        self.colouring: tuple | None = None
        self.set_arrays(arrays)

    # ------------------------------------------------------------------ data
    def set_arrays(self, arrays: FiberArrays) -> None:
        """Another tractogram in the same actors (a tracking result growing): new points."""
        self.arrays = arrays
        points = arrays.points if len(arrays.points) else np.zeros((1, 3), np.float32)  # VTK needs one
        self._points_np = np.ascontiguousarray(points, dtype=np.float32)  # the tractogram's own array
        self.points = vtkPoints()
        self.points.SetData(vtk_array(self._points_np))
        direction = arrays.direction if len(arrays.points) else np.full((1, 4), 255, np.uint8)
        self.point_arrays = {"direction": vtk_array(direction, "direction")}
        self.cell_values: dict[str, np.ndarray] = {}  # per-streamline scalars shown as cell colours
        self.polydata = {"actor": vtkPolyData(), "moving": vtkPolyData()}
        for data in self.polydata.values():
            data.SetPoints(self.points)
            data.GetPointData().AddArray(self.point_arrays["direction"])
        self.cells: dict[str, Cells] = {}
        self.actor.GetMapper().SetInputData(self.polydata["actor"])
        self.moving.GetMapper().SetInputData(self.polydata["moving"])
        matrix = vtkMatrix4x4()
        for i in range(4):
            for j in range(4):
                matrix.SetElement(i, j, float(arrays.affine[i, j]))
        self.actor.SetUserMatrix(matrix)
        self.moving.SetUserMatrix(matrix)
        self.colouring = None

    def show_cells(self, which: str, cells: Cells) -> None:
        """Draw ``cells`` in the rest (``"actor"``) or moving actor: only its indices change."""
        if self.cells.get(which) is cells:
            return
        self.cells[which] = cells
        data = self.polydata[which]
        data.SetLines(cell_array(cells) if len(self.arrays.points) else vtkCellArray())
        for name, values in self.cell_values.items():
            self._set_cell_values(data, cells, name, values)

    def _set_cell_values(self, data: vtkPolyData, cells: Cells, name: str, values: np.ndarray) -> None:
        per_cell = values if cells.streamlines is None else values[cells.streamlines]
        data.GetCellData().AddArray(vtk_array(np.ascontiguousarray(per_cell, dtype=np.float32), name))

    # --------------------------------------------------------------- colours
    def colour(self, name: str, values=None, kind: str = "point", lut=None, clim=None) -> None:
        """Colour by direction (``name == "direction"``) or by a scalar: ``values`` per point
        (``kind`` "point") or per streamline ("streamline"), through ``lut`` over ``clim``."""
        if name != "direction":
            if kind == "point" and name not in self.point_arrays:
                array = vtk_array(np.ascontiguousarray(values, dtype=np.float32), name)
                self.point_arrays[name] = array
                for data in self.polydata.values():
                    data.GetPointData().AddArray(array)
            elif kind == "streamline" and name not in self.cell_values:
                self.cell_values[name] = values
                for which, data in self.polydata.items():
                    if which in self.cells:
                        self._set_cell_values(data, self.cells[which], name, values)
        for which, actor in (("actor", self.actor), ("moving", self.moving)):
            mapper, data = actor.GetMapper(), self.polydata[which]
            mapper.ScalarVisibilityOn()
            mapper.SelectColorArray(name)
            if kind == "streamline" and name != "direction":
                mapper.SetScalarModeToUseCellFieldData()
                data.GetCellData().SetActiveScalars(name)
            else:
                mapper.SetScalarModeToUsePointFieldData()
                data.GetPointData().SetActiveScalars(name)
            if name == "direction":
                mapper.SetColorModeToDirectScalars()
            else:
                mapper.SetColorModeToMapScalars()
                mapper.SetLookupTable(lut)
                mapper.UseLookupTableScalarRangeOff()
                mapper.SetScalarRange(*clim)
                lut.SetTableRange(*clim)
        self.colouring = (name, kind)

    def solid(self, colour: str | None) -> None:
        """One colour for every streamline (a named bundle's, ``"#rrggbb"``; white without one):
        no colour array drawn."""
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)] if colour else [1.0, 1.0, 1.0]
        for actor in (self.actor, self.moving):
            actor.GetMapper().ScalarVisibilityOff()
            actor.GetProperty().SetColor(*rgb)
        self.colouring = ("solid", colour)

    def style(self, visible: bool, opacity: float, tubes: bool) -> None:
        for actor in (self.actor, self.moving):
            prop = actor.GetProperty()
            prop.SetOpacity(opacity)
            prop.SetRenderLinesAsTubes(bool(tubes))  # shaded tubes in the shader: no extra geometry
            prop.SetLineWidth(3.0 if tubes else 1.0)
        self.visible = visible

    def show_moving(self, moving: bool) -> None:
        """While the camera moves: the moving actor (when it draws another level), else the rest one."""
        differ = self.cells.get("moving") is not self.cells.get("actor")
        self.moving.SetVisibility(self.visible and moving and differ)
        self.actor.SetVisibility(self.visible and not (moving and differ))
