"""Tractogram actors of the 3-D view: one vertex buffer per tractogram, index ranges per level.

A :class:`FiberActors` wraps the tractogram's float32 points in ONE ``vtkPoints`` without copying
them (``numpy_to_vtk(deep=False)``) and gives every level of detail its own ``vtkPolyData`` that
shares those points and the colour arrays, differing only in its ``vtkCellArray`` (offsets +
connectivity over the points, also wrapped without copy). VTK keeps one vertex buffer per data
array per render window, so the points go to the GPU once, whichever level is drawn; changing
the level or the selection re-sends only the indices. The mappers upload the float32 points as
they are (VTK's automatic shift and scale, which voxel coordinates would trigger, packs a
second copy of every point in host memory first). A tractogram of more than
:data:`~app.fiber_arrays.PIECE_POINTS` points is drawn as pieces of consecutive streamlines,
each such a vertex buffer over a slice of the same array (VTK counts a buffer's bytes in 32
bits), with the same actors per piece. Two actors show it: ``actor`` at rest and
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

#: vtkOpenGLVertexBufferObject::DISABLE_SHIFT_SCALE (the enum is not wrapped for Python)
DISABLE_SHIFT_SCALE = 0


def lookup_table(name: str, clim: tuple[float, float]) -> pv.LookupTable:
    """The 2-D views' colour map as a VTK lookup table over ``clim``, so both views agree."""
    rgb = LUTS.get(name, LUTS["viridis"])
    rgba = np.concatenate([rgb, np.ones((len(rgb), 1))], axis=1)
    lut = pv.LookupTable(values=(rgba * 255).astype(np.uint8))
    lut.scalar_range = clim
    return lut


def draws_nothing(layer) -> bool:
    """A tractogram without points: its actor stays hidden (out of the camera's bounds too)."""
    return layer.data.n_points == 0


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
    if cells.identity:  # every point in order: an implicit array, nothing stored
        connectivity = vtkAffineArray[str(offsets.dtype)]()
        connectivity.ConstructBackend(1, 0)
        connectivity.SetNumberOfComponents(1)
        connectivity.SetNumberOfTuples(cells.n_points)
    else:
        connectivity = vtk_array(cells.connectivity)
    if not out.SetData(vtk_array(offsets), connectivity):
        raise ValueError("VTK refused the cell arrays")
    return out


class _Piece:
    """The actors of one piece of the point array (consecutive streamlines)."""

    def __init__(self, points: np.ndarray, direction: np.ndarray, matrix: vtkMatrix4x4):
        self.points_np = points
        self.points = vtkPoints()
        self.points.SetData(vtk_array(points))
        self.point_arrays = {"direction": vtk_array(direction, "direction")}
        self.polydata = {"actor": vtkPolyData(), "moving": vtkPolyData()}
        self.actors = {"actor": vtkActor(), "moving": vtkActor()}
        for which, actor in self.actors.items():
            mapper = vtkPolyDataMapper()
            mapper.SetVBOShiftScaleMethod(DISABLE_SHIFT_SCALE)  # no packed copy of the points
            mapper.SetInputData(self.polydata[which])
            actor.SetMapper(mapper)
            actor.PickableOff()
            actor.SetUserMatrix(matrix)
            self.polydata[which].SetPoints(self.points)
            self.polydata[which].GetPointData().AddArray(self.point_arrays["direction"])
        self.actors["moving"].VisibilityOff()


class FiberActors:
    """The 3-D actors of one tractogram (see the module's description). ``actor`` and ``moving``
    (and ``points``, ``polydata``) are the first piece's; :meth:`all_actors` lists every piece's."""

    def __init__(self, arrays: FiberArrays):
        self.visible = True
        self.moving_now = False
        self.colouring: tuple | None = None
        self.pieces: list[_Piece] = []
        self.set_arrays(arrays)

    @property
    def actor(self) -> vtkActor:
        return self.pieces[0].actors["actor"]

    @property
    def moving(self) -> vtkActor:
        return self.pieces[0].actors["moving"]

    @property
    def points(self) -> vtkPoints:
        return self.pieces[0].points

    @property
    def polydata(self) -> dict[str, vtkPolyData]:
        return self.pieces[0].polydata

    def all_actors(self) -> list[vtkActor]:
        """Every piece's rest and moving actor (what the view adds to and removes from the scene)."""
        return [actor for piece in self.pieces for actor in piece.actors.values()]

    # ------------------------------------------------------------------ data
    def set_arrays(self, arrays: FiberArrays) -> None:
        """Another tractogram in the same actors (a tracking result growing): new points. The
        number of pieces must stay (a growing result's do: one until it is whole-brain sized)."""
        self.arrays = arrays
        matrix = vtkMatrix4x4()
        for i in range(4):
            for j in range(4):
                matrix.SetElement(i, j, float(arrays.affine[i, j]))
        if not len(arrays.points):  # VTK needs one point
            parts = [(np.zeros((1, 3), np.float32), np.full((1, 4), 255, np.uint8))]
        else:
            points = np.ascontiguousarray(arrays.points, dtype=np.float32)  # the tractogram's own array
            parts = []
            for a, b in arrays.bounds:
                lo, hi = int(arrays.offsets[a]), int(arrays.offsets[b])
                parts.append((points[lo:hi], arrays.direction[lo:hi]))
        old = self.pieces
        if old and len(old) != len(parts):
            raise ValueError("a tractogram replaced by one of another number of pieces needs new actors")
        self.pieces = [_Piece(p, d, matrix) for p, d in parts]
        for piece, before in zip(self.pieces, old, strict=False):  # the same actors, new data
            for which, actor in before.actors.items():
                actor.GetMapper().SetInputData(piece.polydata[which])
                actor.SetUserMatrix(matrix)
                piece.actors[which] = actor
        self.cell_values: dict[str, np.ndarray] = {}  # per-streamline scalars shown as cell colours
        self.cells: dict[str, Cells] = {}
        self.colouring = None
        self.shown_pieces = len(self.pieces)  # the first pieces drawn (see :meth:`reveal`)

    def show_cells(self, which: str, cells: Cells) -> None:
        """Draw ``cells`` in the rest (``"actor"``) or moving actors: only their indices change."""
        if self.cells.get(which) is cells:
            return
        self.cells[which] = cells
        parts = cells.pieces(self.arrays.offsets, self.arrays.bounds) if len(self.arrays.points) else [None]
        for piece, part in zip(self.pieces, parts, strict=True):
            data = piece.polydata[which]
            data.SetLines(vtkCellArray() if part is None or part.n_streamlines == 0 else cell_array(part))
            piece.cells = {**getattr(piece, "cells", {}), which: part}
            for name, values in self.cell_values.items():
                self._set_cell_values(data, part, name, values)

    def _set_cell_values(self, data: vtkPolyData, cells: Cells | None, name: str, values: np.ndarray) -> None:
        per_cell = values[:0] if cells is None else values[cells.streamline_ids()]
        data.GetCellData().AddArray(vtk_array(np.ascontiguousarray(per_cell, dtype=np.float32), name))

    # --------------------------------------------------------------- colours
    def colour(self, name: str, values=None, kind: str = "point", lut=None, clim=None) -> None:
        """Colour by direction (``name == "direction"``) or by a scalar: ``values`` per point
        (``kind`` "point") or per streamline ("streamline"), through ``lut`` over ``clim``."""
        if name != "direction":
            if kind == "point" and name not in self.pieces[0].point_arrays:
                values = np.ascontiguousarray(values, dtype=np.float32)
                for piece, (a, b) in zip(self.pieces, self.arrays.bounds, strict=False):
                    lo, hi = int(self.arrays.offsets[a]), int(self.arrays.offsets[b])
                    array = vtk_array(values[lo:hi] if len(self.pieces) > 1 else values, name)
                    piece.point_arrays[name] = array
                    for data in piece.polydata.values():
                        data.GetPointData().AddArray(array)
            elif kind == "streamline" and name not in self.cell_values:
                self.cell_values[name] = values
                for piece in self.pieces:
                    for which, data in piece.polydata.items():
                        if which in self.cells:
                            self._set_cell_values(data, piece.cells.get(which), name, values)
        for piece in self.pieces:
            for which, actor in piece.actors.items():
                self._colour_mapper(actor.GetMapper(), piece.polydata[which], name, kind, lut, clim)
        self.colouring = (name, kind)

    @staticmethod
    def _colour_mapper(mapper, data: vtkPolyData, name: str, kind: str, lut, clim) -> None:
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

    def solid(self, colour: str | None) -> None:
        """One colour for every streamline (a named bundle's, ``"#rrggbb"``; white without one):
        no colour array drawn."""
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)] if colour else [1.0, 1.0, 1.0]
        for actor in self.all_actors():
            actor.GetMapper().ScalarVisibilityOff()
            actor.GetProperty().SetColor(*rgb)
        self.colouring = ("solid", colour)

    def style(self, visible: bool, opacity: float, tubes: bool) -> None:
        for actor in self.all_actors():
            prop = actor.GetProperty()
            prop.SetOpacity(opacity)
            prop.SetRenderLinesAsTubes(bool(tubes))  # shaded tubes in the shader: no extra geometry
            prop.SetLineWidth(3.0 if tubes else 1.0)
        self.visible = visible

    def show_moving(self, moving: bool) -> None:
        """While the camera moves: the moving actors (when they draw another level), else the rest ones."""
        self.moving_now = moving
        differ = self.cells.get("moving") is not self.cells.get("actor")
        for k, piece in enumerate(self.pieces):
            shown = self.visible and k < self.shown_pieces
            piece.actors["moving"].SetVisibility(shown and moving and differ)
            piece.actors["actor"].SetVisibility(shown and not (moving and differ))

    def moving_drawn(self) -> bool:
        """Are the moving actors drawn now (the camera moves and they draw another level)?"""
        return bool(self.moving.GetVisibility())

    def reveal(self, count: int) -> None:
        """Draw the first ``count`` pieces only: a frame uploads the buffers of the pieces it
        draws for the first time, so a whole-brain tractogram comes in piece by piece."""
        self.shown_pieces = max(1, min(count, len(self.pieces)))
        self.show_moving(self.moving_now)

    @property
    def filling(self) -> bool:
        """Are some pieces still to be drawn in?"""
        return self.shown_pieces < len(self.pieces)

    def drawn_streamlines(self, which: str) -> int:
        """Streamlines the rest (``"actor"``) or moving actors draw now (of the pieces shown)."""
        cells = self.cells.get(which)
        if cells is None:
            return 0
        if not self.filling:
            return cells.n_streamlines
        parts = cells.pieces(self.arrays.offsets, self.arrays.bounds)
        return sum(part.n_streamlines for part in parts[: self.shown_pieces])
