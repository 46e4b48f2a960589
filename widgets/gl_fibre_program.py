"""The fibre layer's shaders and the OpenGL it runs on (issue 41, :mod:`widgets.gl_fibers`).

What the current context offers is read once (:func:`read_capabilities`: the version both from
GL_MAJOR/MINOR_VERSION and from the version string, the profile, the texture-buffer limit read as
unsigned, the extensions), so that the layer can say which program it draws with and why. The
programs: thin lines and ribbons (tubes) through a geometry shader, and thin lines without one
("pulled": the points read back as a texture buffer, GL 4.0). Where the vertex shader has
``gl_DrawID`` (ARB_shader_draw_parameters), a per-streamline scalar is read from a texture buffer
of one value per streamline, indexed by the draw (each streamline is one draw of
``glMultiDrawArrays``), so no value per point exists.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

LUT_SIZE = 128  # colour map entries in the geometry shader (a uniform array fits every GL 3.2)
GLSL = "#version 150\n"
# gl_DrawID in a GLSL 1.50 vertex shader (the extension directive, in that stage only, precedes any code).
DRAW_IDS_EXTENSION = "#extension GL_ARB_shader_draw_parameters : require\n"

# PULLED (thin lines where the points are also a texture buffer): the vertex shader colours by
# direction from the point before (texelFetch), flat, so that each segment (i, i + 1) takes the
# colour of its last vertex: no geometry shader. Otherwise the geometry shader does it per segment.
VERTEX_SHADER = """
in vec3 position;
in float scalar;
uniform mat4 mvp;
#ifdef DRAW_IDS
uniform samplerBuffer streamline_values;  // one value per streamline of the piece (R32F)
uniform isamplerBuffer drawn_ids;  // the piece's streamline of each draw (R32I), when ids_given
uniform int per_streamline;
uniform int ids_given;
#endif
float scalar_here() {
#ifdef DRAW_IDS
  if (per_streamline == 1) {  // each streamline is one draw of glMultiDrawArrays
    int k = ids_given == 1 ? texelFetch(drawn_ids, gl_DrawIDARB).r : gl_DrawIDARB;
    return texelFetch(streamline_values, k).r;
  }
#endif
  return scalar;
}
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
  float t = clamp((scalar_here() - clim.x) / max(clim.y - clim.x, 1e-30), 0.0, 1.0);
  v_smooth = colour_mode == 1 ? lut[int(t * float(LUT_SIZE - 1) + 0.5)] : solid;
#else
  v_model = position;
  v_scalar = scalar_here();
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
        """``gl_DrawIDARB`` in a GLSL 1.50 vertex shader (ARB_shader_draw_parameters)."""
        return "GL_ARB_shader_draw_parameters" in self.extensions

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


class FibreProgram:
    """The compiled shaders and their uniform locations: ``"lines"`` and ``"ribbons"`` (with a
    geometry shader), and ``"pulled"`` (thin lines without one) where points can also be read as
    a texture buffer of RGB32F texels (GL 4.0) of up to :attr:`max_texels` each.
    :attr:`pulled_refusal` says why there is no ``"pulled"`` program (None: there is);
    :attr:`draw_ids`: the vertex shaders read per-streamline scalars by ``gl_DrawID``."""

    NAMES = ("mvp", "to_world", "colour_mode", "lut", "clim", "solid", "viewport", "width_px", "opacity", "positions",
             "streamline_values", "drawn_ids", "per_streamline", "ids_given")  # fmt: skip

    def __init__(self, GL):
        self.capabilities = caps = read_capabilities(GL)
        sources = {GL.GL_VERTEX_SHADER: VERTEX_SHADER, GL.GL_GEOMETRY_SHADER: GEOMETRY_SHADER,
                   GL.GL_FRAGMENT_SHADER: FRAGMENT_SHADER}  # fmt: skip
        defines = f"#define LUT_SIZE {LUT_SIZE}\n"
        self.draw_ids = caps.draw_ids
        if self.draw_ids:
            try:
                with_ids = {**sources, GL.GL_VERTEX_SHADER: DRAW_IDS_EXTENSION + VERTEX_SHADER}
                self.programs = self._compile_all(GL, with_ids, defines + "#define DRAW_IDS\n")
            except GLUnavailable as error:  # per-streamline scalars are then written per point
                log.info("fibre shaders without gl_DrawID: %s", error)
                self.draw_ids = False
        if not self.draw_ids:
            self.programs = self._compile_all(GL, sources, defines)
        self.uniforms = {
            kind: {name: GL.glGetUniformLocation(program, name) for name in self.NAMES}
            for kind, program in self.programs.items()
        }

    def _compile_all(self, GL, sources: dict, defines: str) -> dict[str, int]:
        caps = self.capabilities
        programs = {
            "lines": _compile(GL, sources, defines),
            "ribbons": _compile(GL, sources, defines + "#define RIBBON\n"),
        }
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
                programs["pulled"] = _compile(GL, pulled, defines + "#define PULLED\n")
            except GLUnavailable as error:  # the geometry shader's programs draw the same picture
                self.pulled_refusal = f"the vertex-pulling shader failed: {error}"
        return programs
