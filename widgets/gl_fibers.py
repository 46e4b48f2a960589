"""Streamlines drawn with OpenGL straight from the tractogram's float32 (or a file's float16) points (issue 41).

VTK's polydata mapper turns polylines into an index buffer on the GUI thread at the first frame
and at every new selection, and builds colour arrays on every colour change: seconds at 1 M
streamlines. Here the points go to the GPU once, one vertex buffer per piece of the point array
(:data:`~app.fiber_arrays.PIECE_POINTS`), uploaded in chunks straight from the array (no host
copy; a file's float16 positions made float32 a chunk at a time); what is drawn is ``glMultiDrawArrays(GL_LINE_STRIP, first, count)`` over the streamlines
shown (a level of detail, a selection: integers only, prepared on workers), and colour is a
shader change: by direction in a geometry shader (the segment's world direction, so no colour
array exists at all), by a scalar through the colour map, or one colour. A per-streamline scalar
(a COMMIT weight) is one float per streamline on the GPU, read by ``gl_DrawID`` (each streamline
is one draw; a selection gives the drawn streamlines' ids), uploaded once per scalar; a per-point
scalar, or any scalar where ``gl_DrawID`` is missing, is a float per point written in chunks. A decimated level (every
k-th point, drawn while the camera moves with software OpenGL) is a small element buffer with
primitive restart. Tubes are screen-aligned ribbons with a shaded profile.

The drawing runs inside VTK's frame, in the opaque pass, when VTK's context is current: the
caller invokes :meth:`FibreBuffers.draw` from a mapper event (see :mod:`widgets.gl_fiber_actors`),
and everything bound here is unbound afterwards (VTK's shader cache is told its program is no
longer bound; enables, depth mask and blending go through VTK's state cache).

PyOpenGL is imported when a tractogram is first drawn this way; without it (the ``gui`` extra),
or when the shaders do not compile, :class:`GLUnavailable` says why and the 3-D view draws the
tractogram with VTK instead.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tractlens.app.io import release_pages

from .gl_fibre_program import LUT_SIZE, FibreProgram, GLUnavailable, load_gl

log = logging.getLogger(__name__)
__all__ = ["LUT_SIZE", "FibreBuffers", "GLUnavailable", "element_arrays", "load_gl", "restart_indices", "upload"]

UPLOAD_CHUNK_BYTES = 64 << 20  # points and scalars go to the GPU this many bytes per call
RESTART_INDEX = 0xFFFFFFFF
FORCE_GEOMETRY_SHADER = False  # thin lines through the geometry shader even where not needed (tests)
FORCE_POINT_SCALARS = False  # per-streamline scalars written per point even where gl_DrawID reads them (tests)


class _PieceBuffers:
    """The GPU buffers of one piece: its points, its scalar (when coloured by one), an element
    buffer (a decimated level) and the vertex array that joins them."""

    def __init__(self, GL, points: np.ndarray):
        self.n_points = len(points)
        self.vao = GL.glGenVertexArrays(1)
        self.position = GL.glGenBuffers(1)
        self.scalar = None
        self.elements = None
        self.n_elements = 0
        self.texture = None  # the points as a texture buffer (the "pulled" program's)
        self.texture_buffers: dict[str, tuple[int, int]] = {}  # name -> (buffer, texture): see set_texture_buffer
        self.strips = None  # a decimated level's (counts, first element byte offsets) per streamline
        self.ids_given = False  # the "ids" texture buffer says which streamline each draw is
        GL.glBindVertexArray(self.vao)
        upload(GL, self.position, points)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, self.position)  # what the attribute reads
        GL.glEnableVertexAttribArray(0)
        GL.glVertexAttribPointer(0, 3, GL.GL_FLOAT, GL.GL_FALSE, 12, None)
        GL.glDisableVertexAttribArray(1)
        GL.glBindVertexArray(0)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)

    def set_scalar(self, GL, chunks) -> None:
        """The scalar of every point of the piece, from ``chunks`` (float32 arrays in order)."""
        if self.scalar is None:
            self.scalar = GL.glGenBuffers(1)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, self.scalar)
        GL.glBufferData(GL.GL_ARRAY_BUFFER, 4 * self.n_points, None, GL.GL_STATIC_DRAW)
        at = 0
        for chunk in chunks:
            chunk = np.ascontiguousarray(chunk, dtype=np.float32)
            GL.glBufferSubData(GL.GL_ARRAY_BUFFER, at, chunk.nbytes, chunk)
            at += chunk.nbytes
        GL.glBindVertexArray(self.vao)  # the scalar buffer stays bound: what the attribute reads
        GL.glEnableVertexAttribArray(1)
        GL.glVertexAttribPointer(1, 1, GL.GL_FLOAT, GL.GL_FALSE, 4, None)
        GL.glBindVertexArray(0)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)

    def set_elements(self, GL, indices: np.ndarray | None) -> None:
        """A decimated level's point indices with restart markers between streamlines (None: none)."""
        if indices is None:
            self.n_elements = 0
            return
        if self.elements is None:
            self.elements = GL.glGenBuffers(1)
        GL.glBindVertexArray(self.vao)
        GL.glBindBuffer(GL.GL_ELEMENT_ARRAY_BUFFER, self.elements)
        indices = np.ascontiguousarray(indices, dtype=np.uint32)
        # written once per level and drawn many times: STATIC (DYNAMIC may keep a host-side copy,
        # some 700 MB for a simplified 10 M-streamline level)
        GL.glBufferData(GL.GL_ELEMENT_ARRAY_BUFFER, max(indices.nbytes, 4), indices if len(indices) else None,
                        GL.GL_STATIC_DRAW)  # fmt: skip
        GL.glBindVertexArray(0)
        GL.glBindBuffer(GL.GL_ELEMENT_ARRAY_BUFFER, 0)
        self.n_elements = len(indices)

    def set_texture_buffer(self, GL, name: str, internal_format: int, values: np.ndarray) -> None:
        """``values`` into the piece's texture buffer ``name`` (``"values"``: a per-streamline
        scalar, R32F; ``"ids"``: the piece's streamline of each draw, R32I)."""
        buffer, texture = self.texture_buffers.get(name, (None, None))
        if buffer is None:
            buffer, texture = GL.glGenBuffers(1), GL.glGenTextures(1)
            self.texture_buffers[name] = (buffer, texture)
        values = np.ascontiguousarray(values)
        GL.glBindBuffer(GL.GL_TEXTURE_BUFFER, buffer)
        GL.glBufferData(GL.GL_TEXTURE_BUFFER, max(values.nbytes, 4), values if len(values) else None, GL.GL_STATIC_DRAW)
        GL.glBindBuffer(GL.GL_TEXTURE_BUFFER, 0)
        GL.glBindTexture(GL.GL_TEXTURE_BUFFER, texture)
        GL.glTexBuffer(GL.GL_TEXTURE_BUFFER, internal_format, buffer)
        GL.glBindTexture(GL.GL_TEXTURE_BUFFER, 0)

    def points_texture(self, GL) -> int:
        """The points as a texture buffer of RGB32F texels (made once, no copy: the same buffer)."""
        if self.texture is None:
            self.texture = GL.glGenTextures(1)
            GL.glBindTexture(GL.GL_TEXTURE_BUFFER, self.texture)
            GL.glTexBuffer(GL.GL_TEXTURE_BUFFER, GL.GL_RGB32F, self.position)
            GL.glBindTexture(GL.GL_TEXTURE_BUFFER, 0)
        return self.texture

    def release(self, GL) -> None:
        if self.texture is not None:
            GL.glDeleteTextures(1, [self.texture])
        for buffer, texture in self.texture_buffers.values():
            GL.glDeleteTextures(1, [texture])
            GL.glDeleteBuffers(1, [buffer])
        GL.glDeleteVertexArrays(1, [self.vao])
        GL.glDeleteBuffers(1, [self.position])
        for buffer in (self.scalar, self.elements):
            if buffer is not None:
                GL.glDeleteBuffers(1, [buffer])


def upload(GL, buffer: int, values: np.ndarray) -> None:
    """``values`` (C-contiguous float32, or float16: made float32 a chunk at a time) into ``buffer``
    as float32, :data:`UPLOAD_CHUNK_BYTES` at a time, read where they are. A file's memory map is
    read as it goes, and after each chunk the map's pages (those the chunk brought in) leave the
    window's resident memory (:func:`app.io.release_pages`; the page cache keeps them), so
    uploading a mapped tractogram does not add the file's size to it, nor a float32 copy of a
    float16 file (the shaders read float32 positions: a texture buffer has no 3 x 16-bit format)."""
    flat = values.reshape(len(values), -1)
    row = 4 * flat.shape[1] if len(flat) else 4  # bytes of a float32 row on the GPU
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buffer)
    GL.glBufferData(GL.GL_ARRAY_BUFFER, max(row * len(flat), 4), None, GL.GL_STATIC_DRAW)
    step = max(1, UPLOAD_CHUNK_BYTES // row)
    for lo in range(0, len(flat), step):
        part = flat[lo : lo + step]
        data = part if part.dtype == np.float32 else part.astype(np.float32)
        GL.glBufferSubData(GL.GL_ARRAY_BUFFER, lo * row, data.nbytes, data)
        release_pages(part)  # only a shared or read-only file map; anything else is left alone
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)


def restart_indices(cells) -> np.ndarray:
    """A decimated level's (:class:`~app.fiber_arrays.Cells`, one piece) point indices, with
    :data:`RESTART_INDEX` after each streamline."""
    connectivity = cells.connectivity.astype(np.uint32)
    offsets = np.asarray(cells.offsets, dtype=np.int64)
    out = np.full(len(connectivity) + cells.n_streamlines, RESTART_INDEX, dtype=np.uint32)
    slots = np.arange(len(connectivity)) + np.repeat(np.arange(cells.n_streamlines), np.diff(offsets))
    out[slots] = connectivity
    return out


def strips(cells) -> tuple[np.ndarray, np.ndarray]:
    """(point counts, first elements' byte offsets) of each streamline of a decimated level in
    its element buffer (:func:`restart_indices`: each streamline followed by a restart marker),
    for ``glMultiDrawElements``: one draw per streamline, so that ``gl_DrawID`` counts them."""
    offsets = np.asarray(cells.offsets, dtype=np.int64)
    firsts = offsets[:-1] + np.arange(len(offsets) - 1)
    return np.diff(offsets).astype(np.int32), (4 * firsts).astype(np.uintp)


class FibreBuffers:
    """One tractogram on the GPU: created empty, filled and drawn by :meth:`draw` (VTK's context
    is current only then). The view sets what to draw; the next frame makes the GL calls."""

    def __init__(self, pieces: list[np.ndarray], affine: np.ndarray, bounds: list[tuple[int, int]] | None = None):
        self.piece_points = pieces  # slices of the tractogram's float32 (or float16) points (no copies)
        self.bounds = bounds if bounds is not None else [(0, 0)] * len(pieces)  # each piece's streamlines [a, b)
        self.affine = np.asarray(affine, dtype=np.float64)
        self.buffers: list[_PieceBuffers] = []
        self.allowed_pieces = len(pieces)  # pieces uploaded so far may be at most this many
        self.ranges: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(pieces)  # (first, count) per piece
        self.decimated: list | None = None  # a decimated level's cells per piece (drawn with elements)
        self._elements_of = None
        self.colour_mode = 0
        self.lut = np.zeros((LUT_SIZE, 3), np.float32)
        self.clim = (0.0, 1.0)
        self.solid = (1.0, 1.0, 1.0)
        self.scalar_key = None  # what the scalar buffers hold now
        self.scalar_source = None  # (key, per piece: a callable giving chunks of a scalar per point)
        self.streamline_source = None  # (key, a scalar per streamline (S,) float32): read by gl_DrawID
        self.drawn = None  # (what the ranges come from, a callable giving each piece's drawn ids or None)
        self.timings: dict[str, float] = {}  # seconds of the last frame's uploads, by what was uploaded
        self.no_value_units = False  # VTK had no texture unit left for per-streamline values once
        self.opacity = 1.0
        self.ribbon = False
        self.visible = True
        self.GL = None
        self.program: FibreProgram | None = None
        self.choice: tuple[str, str] | None = None  # (program kind, why) of the last frame

    @property
    def uploaded(self) -> int:
        return len(self.buffers)

    def start(self) -> None:
        """Import PyOpenGL and compile the shaders (VTK's context must be current)."""
        if self.program is None:
            self.GL = load_gl()
            try:
                self.program = FibreProgram(self.GL)
            except GLUnavailable:
                raise
            except Exception as error:
                raise GLUnavailable(f"OpenGL refused the fibre shaders: {error}") from error

    def draw(self, ren_win, renderer) -> None:
        """Upload what is pending and draw (called inside VTK's frame, its context current)."""
        self.start()
        GL = self.GL
        while self.uploaded < min(self.allowed_pieces, len(self.piece_points)):
            self.buffers.append(_PieceBuffers(GL, self.piece_points[self.uploaded]))
        self._sync_scalars(GL)
        self._sync_elements(GL)
        if not self.visible or not self.buffers:
            return
        state = ren_win.GetState()
        ren_win.GetShaderCache().ReleaseCurrentShader()  # VTK rebinds its own program next time
        kind, why = choice = self.program_choice()
        if choice != self.choice:  # said once per change (the log; the view's status line reads it)
            self.choice = choice
            log.info("fibres drawn as %s: %s", kind, why)
        where = self.program.uniforms[kind]
        GL.glUseProgram(self.program.programs[kind])
        self._set_uniforms(GL, where, renderer)
        units = ren_win.GetTextureUnitManager()
        unit = units.Allocate() if kind == "pulled" else -1  # a texture unit VTK does not use meanwhile
        if kind == "pulled":
            GL.glUniform1i(where["positions"], unit)
        per_streamline = self.per_streamline()
        value_units = (units.Allocate(), units.Allocate()) if per_streamline else None
        if value_units is not None and min(value_units) < 0:  # no texture units left: written per point instead
            for used in value_units:
                if used >= 0:
                    units.Free(used)
            log.info("no texture units for per-streamline values: the scalar is written per point")
            self.no_value_units, value_units, per_streamline = True, None, False
            self._sync_scalars(GL)
        if self.program.draw_ids:
            GL.glUniform1i(where["per_streamline"], int(per_streamline))
        if value_units is not None:
            GL.glUniform1i(where["streamline_values"], value_units[0])
            GL.glUniform1i(where["drawn_ids"], value_units[1])
        state.vtkglEnable(GL.GL_DEPTH_TEST)
        translucent = self.opacity < 1.0
        if translucent:
            state.vtkglEnable(GL.GL_BLEND)
            state.vtkglBlendFuncSeparate(
                GL.GL_SRC_ALPHA, GL.GL_ONE_MINUS_SRC_ALPHA, GL.GL_ONE, GL.GL_ONE_MINUS_SRC_ALPHA
            )
            state.vtkglDepthMask(GL.GL_FALSE)
        try:
            self._draw_pieces(GL, state, unit, value_units, where)
        finally:
            GL.glBindVertexArray(0)
            GL.glUseProgram(0)
            for used in (unit, *(value_units or ())):
                if used >= 0:
                    state.vtkglActiveTexture(GL.GL_TEXTURE0 + used)
                    GL.glBindTexture(GL.GL_TEXTURE_BUFFER, 0)
                    units.Free(used)
            if translucent:
                state.vtkglDepthMask(GL.GL_TRUE)

    def program_kind(self) -> str:
        """The program drawing now (see :meth:`program_choice`)."""
        return self.program_choice()[0]

    def program_choice(self) -> tuple[str, str]:
        """(kind, why): ribbons (tubes); thin lines without a geometry shader ("pulled") where
        this GL reads the points as a texture buffer and every piece fits one; else thin lines
        through the geometry shader ("lines")."""
        if self.ribbon:
            return "ribbons", "tubes are ribbons made by the geometry shader"
        program = self.program
        caps = program.capabilities
        largest = max((len(p) for p in self.piece_points), default=0)
        if FORCE_GEOMETRY_SHADER:
            return "lines", "the geometry shader is forced (FORCE_GEOMETRY_SHADER)"
        if "pulled" not in program.programs:
            return "lines", f"no vertex pulling: {program.pulled_refusal}"
        if largest > program.max_texels:
            return "lines", (
                f"no vertex pulling: a piece of {largest:,} points is over this GL's texture buffers "
                f"of {program.max_texels:,} texels"
            )
        return "pulled", (
            f"vertex pulling: {caps.words()}, texture buffers of up to {program.max_texels:,} texels "
            f"for pieces of up to {largest:,} points"
        )

    def _set_uniforms(self, GL, where: dict, renderer) -> None:
        camera = renderer.GetActiveCamera()
        aspect = renderer.GetTiledAspectRatio()
        clip = camera.GetCompositeProjectionTransformMatrix(aspect, -1, 1)
        world_to_clip = np.array([[clip.GetElement(i, j) for j in range(4)] for i in range(4)])
        mvp = (world_to_clip @ self.affine).astype(np.float32)
        GL.glUniformMatrix4fv(where["mvp"], 1, GL.GL_TRUE, mvp)
        GL.glUniformMatrix3fv(where["to_world"], 1, GL.GL_TRUE, self.affine[:3, :3].astype(np.float32))
        GL.glUniform1i(where["colour_mode"], self.colour_mode)
        GL.glUniform3fv(where["lut"], LUT_SIZE, self.lut)
        GL.glUniform2f(where["clim"], *self.clim)
        GL.glUniform3f(where["solid"], *self.solid)
        width, height = renderer.GetSize()
        GL.glUniform2f(where["viewport"], float(max(width, 1)), float(max(height, 1)))
        GL.glUniform1f(where["width_px"], 3.0)
        GL.glUniform1f(where["opacity"], self.opacity)

    def per_streamline(self) -> bool:
        """Is a per-streamline scalar read in the shader now (by ``gl_DrawID``, no value per point)?"""
        return (
            self.colour_mode == 1
            and self.streamline_source is not None
            and self.program is not None
            and self.program.draw_ids
            and not FORCE_POINT_SCALARS
            and not self.no_value_units
        )

    def _draw_pieces(self, GL, state, unit: int, value_units, where: dict) -> None:
        for k, buffers in enumerate(self.buffers):
            GL.glBindVertexArray(buffers.vao)
            if unit >= 0:
                state.vtkglActiveTexture(GL.GL_TEXTURE0 + unit)
                GL.glBindTexture(GL.GL_TEXTURE_BUFFER, buffers.points_texture(GL))
            if value_units is not None:
                for name, used in zip(("values", "ids"), value_units, strict=True):
                    state.vtkglActiveTexture(GL.GL_TEXTURE0 + used)
                    GL.glBindTexture(GL.GL_TEXTURE_BUFFER, buffers.texture_buffers.get(name, (0, 0))[1])
                GL.glUniform1i(where["ids_given"], int(buffers.ids_given))
            if self.decimated is not None:
                if buffers.n_elements and value_units is not None:  # one draw per streamline: gl_DrawID counts them
                    counts, starts = buffers.strips
                    GL.glMultiDrawElements(GL.GL_LINE_STRIP, counts, GL.GL_UNSIGNED_INT, starts, len(counts))
                elif buffers.n_elements:
                    GL.glEnable(GL.GL_PRIMITIVE_RESTART)
                    GL.glPrimitiveRestartIndex(RESTART_INDEX)
                    GL.glDrawElements(GL.GL_LINE_STRIP, buffers.n_elements, GL.GL_UNSIGNED_INT, None)
                    GL.glDisable(GL.GL_PRIMITIVE_RESTART)
                continue
            ranges = self.ranges[k]
            if ranges is not None and len(ranges[0]):
                GL.glMultiDrawArrays(GL.GL_LINE_STRIP, ranges[0], ranges[1], len(ranges[0]))

    def _sync_scalars(self, GL) -> None:
        if self.colour_mode != 1:
            return
        start = time.perf_counter()
        if self.per_streamline():
            key, values = self.streamline_source
            for k, buffers in enumerate(self.buffers):
                if getattr(buffers, "values_key", None) != key:
                    a, b = self.bounds[k]
                    buffers.set_texture_buffer(GL, "values", GL.GL_R32F, np.asarray(values[a:b], dtype=np.float32))
                    buffers.values_key = key
            self.timings["streamline_values_s"] = time.perf_counter() - start
            self._sync_drawn_ids(GL)
            return
        if self.scalar_source is None:
            return
        key, per_piece = self.scalar_source
        for k, buffers in enumerate(self.buffers):
            if getattr(buffers, "scalar_key", None) != key:
                buffers.set_scalar(GL, per_piece(k))
                buffers.scalar_key = key
        self.timings["point_scalars_s"] = time.perf_counter() - start

    def _sync_drawn_ids(self, GL) -> None:
        """Each piece's streamline of each draw (None: draw k is the piece's streamline k), for
        what is drawn now; uploaded when that changes (a selection, another level)."""
        start = time.perf_counter()
        source, ids_of = self.drawn if self.drawn is not None else (None, None)
        per_piece = None
        for k, buffers in enumerate(self.buffers):
            if getattr(buffers, "ids_of", None) is source:
                continue
            if per_piece is None:
                per_piece = [None] * len(self.piece_points) if ids_of is None else ids_of()
            ids = per_piece[k]
            buffers.ids_given = ids is not None
            if ids is not None:
                buffers.set_texture_buffer(GL, "ids", GL.GL_R32I, np.asarray(ids, dtype=np.int32))
            buffers.ids_of = source
        self.timings["drawn_ids_s"] = time.perf_counter() - start

    def _sync_elements(self, GL) -> None:
        if self.decimated is None:
            return
        for k, buffers in enumerate(self.buffers):
            if getattr(buffers, "elements_of", None) is not self.decimated[k]:
                cells = self.decimated[k]
                made = getattr(cells, "gl_elements", None)  # made on a worker (see element_arrays)
                empty = cells is None or not cells.n_streamlines
                buffers.set_elements(GL, None if empty else made[0] if made else restart_indices(cells))
                buffers.strips = None if cells is None else made[1] if made else strips(cells)
                buffers.elements_of = cells
                if made:
                    cells.gl_elements = None  # on the GPU now: the host's copy goes (made again if needed)

    def release(self, ren_win) -> None:
        """Free the GPU buffers and shaders (makes VTK's context current)."""
        if self.GL is None or ren_win is None or not ren_win.GetInitialized():
            self.buffers = []
            return
        ren_win.MakeCurrent()
        for buffers in self.buffers:
            buffers.release(self.GL)
        self.buffers = []
        if self.program is not None:
            for program in self.program.programs.values():
                self.GL.glDeleteProgram(program)
            self.program = None


def element_arrays(cells, offsets: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """Make each piece's element buffer and draws of a level drawn from point indices on this
    (worker) thread, kept with the piece (``gl_elements``), so that the frame that first draws it
    only uploads them: a simplified 10 M-streamline tractogram has some 10^8 indices."""
    for part in cells.pieces(offsets, bounds):
        if part.n_streamlines and getattr(part, "gl_elements", None) is None:
            part.gl_elements = (restart_indices(part), strips(part))
