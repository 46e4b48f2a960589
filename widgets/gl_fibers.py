"""Streamlines drawn with OpenGL straight from the tractogram's float32 points (issue 41).

VTK's polydata mapper turns polylines into an index buffer on the GUI thread at the first frame
and at every new selection, and builds colour arrays on every colour change: seconds at 1 M
streamlines. Here the points go to the GPU once, one vertex buffer per piece of the point array
(:data:`~app.fiber_arrays.PIECE_POINTS`), uploaded in chunks straight from the array (no host
copy); what is drawn is ``glMultiDrawArrays(GL_LINE_STRIP, first, count)`` over the streamlines
shown (a level of detail, a selection: integers only, prepared on workers), and colour is a
shader change: by direction in a geometry shader (the segment's world direction, so no colour
array exists at all), by a per-point or per-streamline scalar through the colour map (a float per
point on the GPU, written from the scalar in chunks), or one colour. A decimated level (every
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
import re
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

UPLOAD_CHUNK_BYTES = 64 << 20  # points and scalars go to the GPU this many bytes per call
LUT_SIZE = 128  # colour map entries in the geometry shader (a uniform array fits every GL 3.2)
GLSL = "#version 150\n"

# PULLED (thin lines where the points are also a texture buffer): the vertex shader colours by
# direction from the point before (texelFetch), flat, so that each segment (i, i + 1) takes the
# colour of its last vertex: no geometry shader. Otherwise the geometry shader does it per segment.
VERTEX_SHADER = """
in vec3 position;
in float scalar;
uniform mat4 mvp;
#ifdef PULLED
uniform samplerBuffer positions;
uniform mat3 to_world;
uniform int colour_mode;
uniform vec3 lut[LUT_SIZE];
uniform vec2 clim;
uniform vec3 solid;
flat out vec3 v_flat;
out vec3 v_smooth;
#else
out vec3 v_model;
out float v_scalar;
#endif
void main() {
  gl_Position = mvp * vec4(position, 1.0);
#ifdef PULLED
  vec3 d = to_world * (position - texelFetch(positions, max(gl_VertexID - 1, 0)).xyz);
  float len = length(d);
  v_flat = len > 0.0 ? abs(d) / len : vec3(0.0);
  float t = clamp((scalar - clim.x) / max(clim.y - clim.x, 1e-30), 0.0, 1.0);
  v_smooth = colour_mode == 1 ? lut[int(t * float(LUT_SIZE - 1) + 0.5)] : solid;
#else
  v_model = position;
  v_scalar = scalar;
#endif
}
"""

# One segment of a line strip in; a line (thin) or a ribbon WIDTH pixels wide (tubes) out.
GEOMETRY_SHADER = """
layout(lines) in;
#ifdef RIBBON
layout(triangle_strip, max_vertices = 4) out;
#else
layout(line_strip, max_vertices = 2) out;
#endif
in vec3 v_model[];
in float v_scalar[];
uniform mat3 to_world;
uniform int colour_mode;  // 0: direction, 1: scalar through the colour map, 2: one colour
uniform vec3 lut[LUT_SIZE];
uniform vec2 clim;
uniform vec3 solid;
uniform vec2 viewport;
uniform float width_px;
out vec3 g_colour;
out float g_across;
vec3 colour_of(int k, vec3 direction) {
  if (colour_mode == 0) return direction;
  if (colour_mode == 2) return solid;
  float t = clamp((v_scalar[k] - clim.x) / max(clim.y - clim.x, 1e-30), 0.0, 1.0);
  return lut[int(t * float(LUT_SIZE - 1) + 0.5)];
}
void main() {
  vec3 d = to_world * (v_model[1] - v_model[0]);
  float len = length(d);
  vec3 direction = len > 0.0 ? abs(d) / len : vec3(0.0);
  vec4 a = gl_in[0].gl_Position;
  vec4 b = gl_in[1].gl_Position;
#ifdef RIBBON
  vec2 along = (b.xy / b.w - a.xy / a.w) * viewport;
  vec2 normal = length(along) > 0.0 ? normalize(vec2(-along.y, along.x)) : vec2(0.0, 1.0);
  vec2 side = normal * width_px / viewport;  // half the width in normalised device coordinates
  g_colour = colour_of(0, direction);
  g_across = -1.0; gl_Position = a - vec4(side * a.w, 0.0, 0.0); EmitVertex();
  g_across = 1.0; gl_Position = a + vec4(side * a.w, 0.0, 0.0); EmitVertex();
  g_colour = colour_of(1, direction);
  g_across = -1.0; gl_Position = b - vec4(side * b.w, 0.0, 0.0); EmitVertex();
  g_across = 1.0; gl_Position = b + vec4(side * b.w, 0.0, 0.0); EmitVertex();
#else
  g_across = 0.0;
  g_colour = colour_of(0, direction); gl_Position = a; EmitVertex();
  g_colour = colour_of(1, direction); gl_Position = b; EmitVertex();
#endif
  EndPrimitive();
}
"""

FRAGMENT_SHADER = """
#ifdef PULLED
flat in vec3 v_flat;
in vec3 v_smooth;
uniform int colour_mode;
#else
in vec3 g_colour;
in float g_across;
#endif
uniform float opacity;
out vec4 frag_colour;
void main() {
#ifdef PULLED
  frag_colour = vec4(colour_mode == 0 ? v_flat : v_smooth, opacity);
#else
  float shade = sqrt(max(0.0, 1.0 - g_across * g_across));  // a tube's profile across the ribbon
  frag_colour = vec4(g_colour * (0.35 + 0.65 * shade), opacity);
#endif
}
"""

RESTART_INDEX = 0xFFFFFFFF
FORCE_GEOMETRY_SHADER = False  # thin lines through the geometry shader even where not needed (tests)


class GLUnavailable(RuntimeError):
    """This OpenGL cannot draw tractograms from their own buffers (the message says why)."""


def load_gl():
    """PyOpenGL's ``GL`` module, without per-call error checks (a frame makes few calls, and a
    ``glGetError`` after each would cost more than the call)."""
    try:
        import OpenGL
    except ImportError as error:
        raise GLUnavailable("PyOpenGL is not installed (pip install 'tractlens[gui]')") from error
    OpenGL.ERROR_CHECKING = False
    from OpenGL import GL

    return GL


def _compile(GL, sources: dict[int, str], defines: str) -> int:
    shaders = []
    for kind, body in sources.items():
        shader = GL.glCreateShader(kind)
        GL.glShaderSource(shader, GLSL + defines + body)
        GL.glCompileShader(shader)
        if not GL.glGetShaderiv(shader, GL.GL_COMPILE_STATUS):
            log = GL.glGetShaderInfoLog(shader)
            raise GLUnavailable(f"a fibre shader does not compile here: {log!r:.300}")
        shaders.append(shader)
    program = GL.glCreateProgram()
    for shader in shaders:
        GL.glAttachShader(program, shader)
    GL.glBindAttribLocation(program, 0, "position")
    GL.glBindAttribLocation(program, 1, "scalar")
    GL.glLinkProgram(program)
    for shader in shaders:
        GL.glDeleteShader(shader)
    if not GL.glGetProgramiv(program, GL.GL_LINK_STATUS):
        raise GLUnavailable(f"the fibre shaders do not link here: {GL.glGetProgramInfoLog(program)!r:.300}")
    return program


def _integer(value) -> int | None:
    """An integer that PyOpenGL returned (an int, a NumPy scalar or a one-element array), or None."""
    try:
        return int(np.asarray(value).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        return None


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


@dataclass(frozen=True)
class GLCapabilities:
    """What the current OpenGL context offers the fibre layer, read once per context
    (:func:`read_capabilities`), with the raw answers kept so that a probe can show them."""

    vendor: str = ""
    renderer: str = ""
    version_string: str = ""
    glsl_version: str = ""
    queried_version: tuple | None = None  # GL_MAJOR_VERSION / GL_MINOR_VERSION as PyOpenGL returned them
    version: tuple[int, int] = (0, 0)  # what is used: the larger of the queried and the string's
    profile: str = "unknown"  # "core", "compatibility" (GL_CONTEXT_PROFILE_MASK) or "unknown"
    max_texture_buffer_texels: int = 0  # GL_MAX_TEXTURE_BUFFER_SIZE, read as unsigned (0: unknown)
    raw_max_texture_buffer: object = None
    extensions: frozenset = frozenset()
    errors: tuple = ()  # queries that failed, in words

    @property
    def rgb32f_texture_buffers(self) -> bool:
        """Points (RGB32F texels) readable as a texture buffer: GL 4.0 or ARB_texture_buffer_object_rgb32."""
        return self.version >= (4, 0) or "GL_ARB_texture_buffer_object_rgb32" in self.extensions

    @property
    def draw_ids(self) -> bool:
        """``gl_DrawID`` in the vertex shader (GL 4.6 or ARB_shader_draw_parameters)."""
        return self.version >= (4, 6) or "GL_ARB_shader_draw_parameters" in self.extensions

    def words(self) -> str:
        return (
            f"GL {self.version[0]}.{self.version[1]} {self.profile} ({self.version_string!r}, queried "
            f"{self.queried_version}), {self.renderer!r}"
        )


def read_capabilities(GL) -> GLCapabilities:
    """The current context's :class:`GLCapabilities`. The version is read both ways, from
    GL_MAJOR/MINOR_VERSION and from the version string, and the larger is used: the features
    needed are checked on their own (texture buffer size, extensions) and a shader that does
    not compile falls back anyway."""
    errors = []

    def ask(what, call):
        try:
            return call()
        except Exception as error:  # a query this context refuses is reported, not fatal
            errors.append(f"{what}: {error}")
            return None

    strings = {name: _text(ask(name, lambda n=name: GL.glGetString(getattr(GL, n))))
               for name in ("GL_VENDOR", "GL_RENDERER", "GL_VERSION", "GL_SHADING_LANGUAGE_VERSION")}  # fmt: skip
    found = re.search(r"(\d+)\.(\d+)", strings["GL_VERSION"])
    parsed = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    major = _integer(ask("GL_MAJOR_VERSION", lambda: GL.glGetIntegerv(GL.GL_MAJOR_VERSION)))
    minor = _integer(ask("GL_MINOR_VERSION", lambda: GL.glGetIntegerv(GL.GL_MINOR_VERSION)))
    queried = None if major is None or minor is None else (major, minor)
    version = max(parsed, queried if queried is not None and 0 < queried[0] < 100 else (0, 0))
    mask = _integer(ask("GL_CONTEXT_PROFILE_MASK", lambda: GL.glGetIntegerv(GL.GL_CONTEXT_PROFILE_MASK)))
    profile = "unknown" if mask is None else "core" if mask & 1 else "compatibility" if mask & 2 else f"mask {mask}"
    raw_texels = ask("GL_MAX_TEXTURE_BUFFER_SIZE", lambda: GL.glGetIntegerv(GL.GL_MAX_TEXTURE_BUFFER_SIZE))
    texels = _integer(raw_texels)
    texels = 0 if texels is None else texels % (1 << 32)  # a GLint: a limit of 2^31 or more reads negative
    count = _integer(ask("GL_NUM_EXTENSIONS", lambda: GL.glGetIntegerv(GL.GL_NUM_EXTENSIONS))) or 0
    names = ask("GL_EXTENSIONS", lambda: [_text(GL.glGetStringi(GL.GL_EXTENSIONS, i)) for i in range(count)])
    return GLCapabilities(
        vendor=strings["GL_VENDOR"],
        renderer=strings["GL_RENDERER"],
        version_string=strings["GL_VERSION"],
        glsl_version=strings["GL_SHADING_LANGUAGE_VERSION"],
        queried_version=queried,
        version=version,
        profile=profile,
        max_texture_buffer_texels=texels,
        raw_max_texture_buffer=None if raw_texels is None else repr(raw_texels),
        extensions=frozenset(names or ()),
        errors=tuple(errors),
    )


class _Program:
    """The compiled shaders and their uniform locations: ``"lines"`` and ``"ribbons"`` (with a
    geometry shader), and ``"pulled"`` (thin lines without one) where points can also be read as
    a texture buffer of RGB32F texels (GL 4.0) of up to :attr:`max_texels` each.
    :attr:`pulled_refusal` says why there is no ``"pulled"`` program (None: there is)."""

    NAMES = ("mvp", "to_world", "colour_mode", "lut", "clim", "solid", "viewport", "width_px", "opacity", "positions")

    def __init__(self, GL):
        sources = {GL.GL_VERTEX_SHADER: VERTEX_SHADER, GL.GL_GEOMETRY_SHADER: GEOMETRY_SHADER,
                   GL.GL_FRAGMENT_SHADER: FRAGMENT_SHADER}  # fmt: skip
        defines = f"#define LUT_SIZE {LUT_SIZE}\n"
        self.programs = {
            "lines": _compile(GL, sources, defines),
            "ribbons": _compile(GL, sources, defines + "#define RIBBON\n"),
        }
        self.capabilities = caps = read_capabilities(GL)
        self.max_texels = caps.max_texture_buffer_texels if caps.rgb32f_texture_buffers else 0
        self.pulled_refusal = None
        if not caps.rgb32f_texture_buffers:
            self.pulled_refusal = (
                f"no RGB32F texture buffers ({caps.words()}; needs GL 4.0 or ARB_texture_buffer_object_rgb32)"
            )
        elif not self.max_texels:
            self.pulled_refusal = f"GL_MAX_TEXTURE_BUFFER_SIZE unknown (read {caps.raw_max_texture_buffer})"
        else:
            pulled = {k: v for k, v in sources.items() if k != GL.GL_GEOMETRY_SHADER}
            try:
                self.programs["pulled"] = _compile(GL, pulled, defines + "#define PULLED\n")
            except GLUnavailable as error:  # the geometry shader's programs draw the same picture
                self.pulled_refusal = f"the vertex-pulling shader failed: {error}"
        self.uniforms = {
            kind: {name: GL.glGetUniformLocation(program, name) for name in self.NAMES}
            for kind, program in self.programs.items()
        }


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
        GL.glBufferData(GL.GL_ELEMENT_ARRAY_BUFFER, max(indices.nbytes, 4), indices if len(indices) else None,
                        GL.GL_DYNAMIC_DRAW)  # fmt: skip
        GL.glBindVertexArray(0)
        GL.glBindBuffer(GL.GL_ELEMENT_ARRAY_BUFFER, 0)
        self.n_elements = len(indices)

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
        GL.glDeleteVertexArrays(1, [self.vao])
        GL.glDeleteBuffers(1, [self.position])
        for buffer in (self.scalar, self.elements):
            if buffer is not None:
                GL.glDeleteBuffers(1, [buffer])


def upload(GL, buffer: int, values: np.ndarray) -> None:
    """``values`` (C-contiguous) into ``buffer`` :data:`UPLOAD_CHUNK_BYTES` at a time, read where
    they are (a memory map's pages are read as they go)."""
    flat = values.reshape(len(values), -1)
    row = flat.strides[0]
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buffer)
    GL.glBufferData(GL.GL_ARRAY_BUFFER, max(values.nbytes, 4), None, GL.GL_STATIC_DRAW)
    step = max(1, UPLOAD_CHUNK_BYTES // row)
    for lo in range(0, len(flat), step):
        part = flat[lo : lo + step]
        GL.glBufferSubData(GL.GL_ARRAY_BUFFER, lo * row, part.nbytes, part)
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


class FibreBuffers:
    """One tractogram on the GPU: created empty, filled and drawn by :meth:`draw` (VTK's context
    is current only then). The view sets what to draw; the next frame makes the GL calls."""

    def __init__(self, pieces: list[np.ndarray], affine: np.ndarray):
        self.piece_points = pieces  # slices of the tractogram's float32 points (no copies)
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
        self.scalar_source = None  # (key, per piece: a callable giving chunks)
        self.opacity = 1.0
        self.ribbon = False
        self.visible = True
        self.GL = None
        self.program: _Program | None = None
        self.choice: tuple[str, str] | None = None  # (program kind, why) of the last frame

    @property
    def uploaded(self) -> int:
        return len(self.buffers)

    def start(self) -> None:
        """Import PyOpenGL and compile the shaders (VTK's context must be current)."""
        if self.program is None:
            self.GL = load_gl()
            try:
                self.program = _Program(self.GL)
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
        state.vtkglEnable(GL.GL_DEPTH_TEST)
        translucent = self.opacity < 1.0
        if translucent:
            state.vtkglEnable(GL.GL_BLEND)
            state.vtkglBlendFuncSeparate(
                GL.GL_SRC_ALPHA, GL.GL_ONE_MINUS_SRC_ALPHA, GL.GL_ONE, GL.GL_ONE_MINUS_SRC_ALPHA
            )
            state.vtkglDepthMask(GL.GL_FALSE)
        try:
            self._draw_pieces(GL, state, unit)
        finally:
            GL.glBindVertexArray(0)
            GL.glUseProgram(0)
            if unit >= 0:
                state.vtkglActiveTexture(GL.GL_TEXTURE0 + unit)
                GL.glBindTexture(GL.GL_TEXTURE_BUFFER, 0)
                units.Free(unit)
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

    def _draw_pieces(self, GL, state, unit: int) -> None:
        for k, buffers in enumerate(self.buffers):
            GL.glBindVertexArray(buffers.vao)
            if unit >= 0:
                state.vtkglActiveTexture(GL.GL_TEXTURE0 + unit)
                GL.glBindTexture(GL.GL_TEXTURE_BUFFER, buffers.points_texture(GL))
            if self.decimated is not None:
                if buffers.n_elements:
                    GL.glEnable(GL.GL_PRIMITIVE_RESTART)
                    GL.glPrimitiveRestartIndex(RESTART_INDEX)
                    GL.glDrawElements(GL.GL_LINE_STRIP, buffers.n_elements, GL.GL_UNSIGNED_INT, None)
                    GL.glDisable(GL.GL_PRIMITIVE_RESTART)
                continue
            ranges = self.ranges[k]
            if ranges is not None and len(ranges[0]):
                GL.glMultiDrawArrays(GL.GL_LINE_STRIP, ranges[0], ranges[1], len(ranges[0]))

    def _sync_scalars(self, GL) -> None:
        if self.scalar_source is None or self.colour_mode != 1:
            return
        key, per_piece = self.scalar_source
        for k, buffers in enumerate(self.buffers):
            if getattr(buffers, "scalar_key", None) != key:
                buffers.set_scalar(GL, per_piece(k))
                buffers.scalar_key = key

    def _sync_elements(self, GL) -> None:
        if self.decimated is None:
            return
        for k, buffers in enumerate(self.buffers):
            if getattr(buffers, "elements_of", None) is not self.decimated[k]:
                cells = self.decimated[k]
                buffers.set_elements(GL, None if cells is None or not cells.n_streamlines else restart_indices(cells))
                buffers.elements_of = cells

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
