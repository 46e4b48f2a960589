"""A tractogram drawn from its own buffers (:mod:`widgets.gl_fibers`), with the interface of
:class:`widgets.fiber_actors.FiberActors` so that the 3-D view treats both alike.

VTK knows the tractogram through one *anchor* actor: a mapper over the eight corners of the
tractogram's box and two triangles of zero area (so VTK frames the camera and sets the clipping range around it,
and draws nothing itself), whose start-of-drawing event draws the streamlines in VTK's opaque
pass, while its context is current and before overlays (the level-of-detail line and colour
bars stay on top). The anchor's mapper carries the lookup table and scalar range when a scalar
colours the streamlines, for the colour bar. Showing another level or selection gives the
buffers new ``(first, count)`` ranges (prepared on the workers, :meth:`app.fiber_arrays.Cells.ranges`);
colouring changes a shader uniform, or writes a scalar once (one float per streamline, read by
``gl_DrawID``; per point where that is missing or the scalar is per point); nothing is rebuilt.
"""

from __future__ import annotations

import functools

import numpy as np
from vtkmodules.vtkCommonCore import vtkCommand, vtkPoints
from vtkmodules.vtkCommonDataModel import vtkCellArray, vtkPolyData
from vtkmodules.vtkCommonMath import vtkMatrix4x4
from vtkmodules.vtkRenderingCore import vtkActor, vtkPolyDataMapper

from tractlens.app.fiber_arrays import Cells, FiberArrays

from .gl_fibers import LUT_SIZE, FibreBuffers, GLUnavailable


def _matrix(affine: np.ndarray) -> vtkMatrix4x4:
    matrix = vtkMatrix4x4()
    for i in range(4):
        for j in range(4):
            matrix.SetElement(i, j, float(affine[i, j]))
    return matrix


def box_corners(dimensions) -> np.ndarray:
    """The eight corners (voxel coordinates) of a grid's box, half a voxel beyond the centres."""
    hi = np.asarray(dimensions, dtype=np.float32) - 0.5
    return np.array([[x, y, z] for x in (-0.5, hi[0]) for y in (-0.5, hi[1]) for z in (-0.5, hi[2])], np.float32)


class GLFiberActors:
    """The 3-D presence of one tractogram drawn from its own buffers (see the module's text).
    ``failed`` holds why, when OpenGL could not draw it (the view then draws it with VTK)."""

    def __init__(self, arrays: FiberArrays, dimensions, on_failure=None):
        self.visible = True
        self.moving_now = False
        self.colouring: tuple | None = None
        self.failed: str | None = None
        self.on_failure = on_failure
        self.cells: dict[str, Cells] = {}
        self.moving_stride = 1  # every k-th streamline of the moving level is drawn (set_moving_stride)
        self._drawn_key: tuple | None = None  # (cells, stride) whose drawn ids the buffers read
        self.anchor = vtkActor()
        self.anchor.PickableOff()
        self._box = vtkPolyData()
        self._box_points = vtkPoints()
        self._box.SetPoints(self._box_points)
        # VTK calls a mapper only for data with cells, and bounds data by its cells' points: two
        # triangles of zero area (no pixel) at opposite corners of the box.
        triangles = vtkCellArray()
        triangles.InsertNextCell(3, [0, 0, 0])
        triangles.InsertNextCell(3, [7, 7, 7])
        self._box.SetPolys(triangles)
        mapper = vtkPolyDataMapper()
        mapper.SetInputData(self._box)
        mapper.ScalarVisibilityOff()
        mapper.SetStatic(1)  # no pipeline updates: its start event then comes from drawing only
        mapper.AddObserver(vtkCommand.StartEvent, self._draw)
        self.anchor.SetMapper(mapper)
        self.renderer = None
        self.set_arrays(arrays, dimensions)

    # --------------------------------------------------------- as FiberActors
    @property
    def actor(self) -> vtkActor:
        return self.anchor

    @property
    def pieces(self) -> list[np.ndarray]:
        return self.gl.piece_points

    @property
    def shown_pieces(self) -> int:
        return self.gl.allowed_pieces

    def all_actors(self) -> list[vtkActor]:
        return [self.anchor]

    def set_arrays(self, arrays: FiberArrays, dimensions=None) -> None:
        """Another tractogram (a tracking result growing): new buffers with the next frame. The
        anchor is bounded by ``arrays.box`` (the grid's corners in the points' frame) when it is
        set, else by the voxel corners of a grid of ``dimensions``."""
        old = getattr(self, "gl", None)
        if old is not None and len(old.piece_points) != len(arrays.bounds):
            raise ValueError("a tractogram replaced by one of another number of pieces needs new actors")
        self.arrays = arrays
        self.points = arrays.points
        points = arrays.points  # a file's float16 millimetres stay so: made float32 as they are uploaded
        if points.dtype not in (np.float32, np.float16) or not points.flags.c_contiguous:
            points = np.ascontiguousarray(points, dtype=np.float32)
        pieces = [points[int(arrays.offsets[a]) : int(arrays.offsets[b])] for a, b in arrays.bounds]
        self.gl = FibreBuffers(pieces, arrays.affine, list(arrays.bounds))
        if old is not None:
            self._retired = [*getattr(self, "_retired", []), old]  # freed at the next frame (context current)
            self.gl.opacity, self.gl.ribbon, self.gl.visible = old.opacity, old.ribbon, old.visible
            self.gl.GL, self.gl.program, old.program = old.GL, old.program, None  # the shaders stay
        corners = arrays.box  # the grid's box in the points' frame (a file's millimetres, or voxels)
        if corners is None and dimensions is not None:
            corners = box_corners(dimensions)
        if corners is not None:
            self._box_points.SetData(_vtk_points(np.ascontiguousarray(corners, dtype=np.float32)))
            self._box.Modified()
        self.anchor.SetUserMatrix(_matrix(arrays.affine))
        self.cells = {}
        self._drawn_key = None
        self.colouring = None

    def show_cells(self, which: str, cells: Cells) -> None:
        if self.cells.get(which) is cells:
            return
        self.cells[which] = cells
        self._choose_ranges()

    def set_moving_stride(self, stride: int) -> None:
        """Draw every ``stride``-th streamline of the moving level while the camera moves (the view
        sets it from the GPU's measured drawing rate, so that a moving frame keeps its budget)."""
        stride = max(1, int(stride))
        if stride != self.moving_stride:
            self.moving_stride = stride
            self._choose_ranges()

    def _choose_ranges(self) -> None:
        moving = self.moving_drawn()
        cells = self.cells.get("moving" if moving else "actor")
        if cells is None:
            return
        arrays = self.arrays
        stride = self.moving_stride if moving and not cells.decimated else 1
        if cells.decimated:
            self.gl.decimated = cells.pieces(arrays.offsets, arrays.bounds)
        else:
            self.gl.decimated = None
            self.gl.ranges = [
                (np.ascontiguousarray(first[::stride]), np.ascontiguousarray(count[::stride]))
                for first, count in cells.ranges(arrays.offsets, arrays.bounds)
            ]
        key = self._drawn_key
        if key is None or key[0] is not cells or key[1] != stride:  # read only for a per-streamline scalar
            self._drawn_key = key = (cells, stride)
            self.gl.drawn = (key, functools.partial(drawn_ids, cells, arrays.offsets, arrays.bounds, stride))

    def colour(self, name: str, values=None, kind: str = "point", lut=None, clim=None) -> None:
        """By direction (the geometry shader's), or a scalar per point or per streamline through
        ``lut`` (a VTK lookup table, read into the shader's colour map) over ``clim``."""
        mapper = self.anchor.GetMapper()
        if name == "direction":
            self.gl.colour_mode = 0
            mapper.ScalarVisibilityOff()
        else:
            self.gl.colour_mode = 1
            self.gl.clim = (float(clim[0]), float(clim[1]))
            self.gl.lut = _lut_rgb(lut)
            self.gl.scalar_source = ((name, kind), self._scalar_chunks(values, kind))  # where gl_DrawID is not
            self.gl.streamline_source = ((name, kind), values) if kind == "streamline" else None
            mapper.SetLookupTable(lut)  # the colour bar's
            mapper.UseLookupTableScalarRangeOff()
            mapper.SetScalarRange(*clim)
            lut.SetTableRange(*clim)
        self.colouring = (name, kind)

    def _scalar_chunks(self, values: np.ndarray, kind: str):
        offsets, bounds = self.arrays.offsets, self.arrays.bounds
        points_per_chunk = 1 << 22  # 16 MB of float32 written at a time: no copy of a whole scalar
        streamlines_per_chunk = max(1, points_per_chunk * (len(offsets) - 1) // max(int(offsets[-1]), 1))

        def chunks(k: int):
            a, b = bounds[k]
            if kind == "point":
                lo, hi = int(offsets[a]), int(offsets[b])
                for start in range(lo, hi, points_per_chunk):
                    yield values[start : min(hi, start + points_per_chunk)]
            else:  # a streamline's value for each of its points, a chunk of streamlines at a time
                for start in range(a, b, streamlines_per_chunk):
                    stop = min(b, start + streamlines_per_chunk)
                    lengths = np.diff(offsets[start : stop + 1])  # (only where gl_DrawID is missing)
                    yield np.repeat(np.asarray(values[start:stop], np.float32), lengths)

        return chunks

    def solid(self, colour: str | None) -> None:
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)] if colour else [1.0, 1.0, 1.0]
        self.gl.colour_mode, self.gl.solid = 2, tuple(rgb)
        self.anchor.GetMapper().ScalarVisibilityOff()
        self.anchor.GetProperty().SetColor(*rgb)
        self.colouring = ("solid", colour)

    def style(self, visible: bool, opacity: float, tubes: bool) -> None:
        self.gl.opacity, self.gl.ribbon = float(opacity), bool(tubes)
        self.anchor.GetProperty().SetRenderLinesAsTubes(bool(tubes))  # said, for whoever asks
        self.visible = visible

    def show_moving(self, moving: bool) -> None:
        self.moving_now = moving
        self.gl.visible = self.visible
        self.anchor.SetVisibility(self.visible)
        self._choose_ranges()

    def moving_drawn(self) -> bool:
        """Is the moving level drawn now (the camera moves and it differs from the rest level)?"""
        return self.moving_now and self.cells.get("moving") is not self.cells.get("actor")

    def reveal(self, count: int) -> None:
        self.gl.allowed_pieces = max(1, min(count, len(self.gl.piece_points)))

    @property
    def uploaded_pieces(self) -> int:
        """Pieces on the GPU (drawn at least once)."""
        return self.gl.uploaded

    @property
    def filling(self) -> bool:
        """Are some pieces still to be revealed (each frame uploads the pieces it may draw)?"""
        return self.gl.allowed_pieces < len(self.gl.piece_points)

    def drawn_streamlines(self, which: str) -> int:
        cells = self.cells.get(which)
        if cells is None:
            return 0
        stride = self.moving_stride if which == "moving" and not cells.decimated else 1
        if stride > 1:  # every stride-th of each piece's ranges
            shown = self.shown_pieces if self.filling else len(self.gl.piece_points)
            return sum(
                -(-len(first) // stride) for first, _c in cells.ranges(self.arrays.offsets, self.arrays.bounds)[:shown]
            )
        if not self.filling:
            return cells.n_streamlines
        if cells.decimated:
            return sum(
                part.n_streamlines
                for part in cells.pieces(self.arrays.offsets, self.arrays.bounds)[: self.shown_pieces]
            )
        return sum(
            len(first) for first, _count in cells.ranges(self.arrays.offsets, self.arrays.bounds)[: self.shown_pieces]
        )

    # ------------------------------------------------------------- drawing
    def _draw(self, *_args) -> None:
        """The anchor's mapper starts drawing: VTK's context is current, its camera set."""
        if self.failed is not None or self.renderer is None:
            return
        ren_win = self.renderer.GetRenderWindow()
        for old in getattr(self, "_retired", []):
            old.release(ren_win)
        self._retired = []
        try:
            self.gl.draw(ren_win, self.renderer)
        except GLUnavailable as error:
            self._fail(str(error))
        except Exception as error:
            self._fail(f"OpenGL failed drawing the fibres: {error}")

    def _fail(self, reason: str) -> None:
        self.failed = reason
        if self.on_failure is not None:
            self.on_failure(self, reason)

    def release(self) -> None:
        """Free the GPU buffers (the layer is gone)."""
        ren_win = None if self.renderer is None else self.renderer.GetRenderWindow()
        for gl in [self.gl, *getattr(self, "_retired", [])]:
            gl.release(ren_win)


def drawn_ids(cells: Cells, offsets: np.ndarray, bounds: list[tuple[int, int]], stride: int = 1) -> list:
    """Per piece (``bounds``: streamlines [a, b)), the piece's streamline (from a) of each draw of
    ``cells`` as int32, or None where draw k is the piece's streamline k (every one, in order);
    with ``stride``, of every stride-th draw (:meth:`GLFiberActors.set_moving_stride`)."""
    if stride > 1:
        whole = drawn_ids(cells, offsets, bounds)
        ranges = cells.ranges(offsets, bounds)
        return [
            (np.arange(len(first), dtype=np.int32) if ids is None else ids)[::stride].copy()
            for ids, (first, _count) in zip(whole, ranges, strict=True)
        ]
    if cells.decimated:
        parts = cells.pieces(offsets, bounds)
        return [None if part.streamlines is None else (np.asarray(part.streamlines) - a).astype(np.int32)
                for part, (a, _b) in zip(parts, bounds, strict=True)]  # fmt: skip
    ids = cells.streamline_ids()
    if isinstance(ids, slice):
        out = []
        for a, b in bounds:
            lo, hi = max(a, ids.start), min(b, ids.stop)
            out.append(None if lo == a else np.arange(lo - a, max(lo, hi) - a, dtype=np.int32))
        return out
    cuts = np.searchsorted(ids, [a for a, _b in bounds] + [bounds[-1][1]])
    return [(ids[int(cuts[k]) : int(cuts[k + 1])] - a).astype(np.int32) for k, (a, _b) in enumerate(bounds)]


def _vtk_points(corners: np.ndarray):
    from vtkmodules.util.numpy_support import numpy_to_vtk

    return numpy_to_vtk(corners, deep=True)


def _lut_rgb(lut) -> np.ndarray:
    """:data:`LUT_SIZE` RGB entries (0..1) of a VTK lookup table, across its whole table."""
    table = lut.GetTable()
    n = table.GetNumberOfTuples()
    rows = np.array([table.GetTuple4(int(i)) for i in np.linspace(0, n - 1, LUT_SIZE).round()], np.float32)
    return np.ascontiguousarray(rows[:, :3] / 255.0)
