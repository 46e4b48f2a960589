"""How to draw a million streamlines in one frame: ways of submitting the same line strips to
OpenGL, timed side by side in one context (issue 41, "1 M streamlines all drawn while rotating").

    python tests/benchmarks/bench_gl_draws.py [--streamlines 1000000] [--points 100] [--out FILE]

Makes a VTK render window of the 3-D view's size (431 x 455 pixels, as in bench_render.py's main
window), uploads ``streamlines x points`` synthetic points (bench_render.synthetic_part: 1 mm
steps through a brain-sized ellipsoid) once, and times, with ``glFinish`` after each frame (the
median of ``--frames``), each way of drawing them, coloured by direction as the fibre layer's
"pulled" program does (the segment's direction from the point before, flat):

- ``multi``: ``glMultiDrawArrays(GL_LINE_STRIP)``, one draw per streamline (what the layer does);
- ``multi_plain``: the same with a one-colour shader (no texture fetch): the shader's share;
- ``strip``: one ``glDrawArrays(GL_LINE_STRIP)`` over all points, the segments joining one
  streamline to the next drawn too (not a picture to show: the floor of one draw);
- ``restart``: one ``glDrawElements`` over an index buffer with primitive restart (4 bytes a point);
- ``strip_bits``: one strip, each streamline's first point marked in a bit array (1 bit a point) and
  the joining segment discarded in the fragment shader;
- ``lines_pulled``: one ``glDrawArrays(GL_LINES)`` of two vertices a segment, the points read by
  ``gl_VertexID`` from the texture buffer, joining segments sent outside the clip volume;
- ``multi_outside``: ``multi`` with every point outside the clip volume (vertices, no pixels);
- ``multi_16px``: ``multi`` into a 16 x 16 pixel viewport (the same primitives, few pixels);
- ``points``: every point as a GL point (one vertex a primitive);
- ``multi_half``: one draw per streamline over every second point (a vertex stride of two points,
  two vertex arrays for the streamlines starting on even and odd points).

Prints and writes JSON: per way the frame's median and the CPU time of the draw call alone.
On the GPU machine: after render_on_gpu.sh's set-up (SETUP_ONLY=1), ``source
tests/benchmarks/gui_env_on_gpu.sh`` then this script.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HEAD = "#version 150\n"
VERTEX = """
in vec3 position;
uniform mat4 mvp;
uniform samplerBuffer positions;
uniform usamplerBuffer starts;
uniform int parity;  // mode 4: the vertex array's first point (0 or 1)
uniform int mode;  // 0 direction from the point before; 1 plain; 2 + start bits; 3 pulled lines; 4 half
flat out vec3 v_colour;
flat out int v_drop;
bool is_start(int i) { return ((texelFetch(starts, i >> 5).r >> uint(i & 31)) & 1u) == 1u; }
void main() {
  v_drop = 0;
  if (mode == 3) {
    int segment = gl_VertexID >> 1;
    int i = segment + (gl_VertexID & 1);
    vec3 p = texelFetch(positions, i).xyz;
    vec3 d = texelFetch(positions, segment + 1).xyz - texelFetch(positions, segment).xyz;
    v_colour = abs(d) / max(length(d), 1e-6);
    gl_Position = is_start(segment + 1) ? vec4(2.0, 2.0, 2.0, 1.0) : mvp * vec4(p, 1.0);
    return;
  }
  gl_Position = mvp * vec4(position, 1.0);
  if (mode == 1) { v_colour = vec3(1.0, 0.8, 0.2); return; }
  int before = mode == 4 ? max(2 * gl_VertexID - 2 + parity, 0) : max(gl_VertexID - 1, 0);
  vec3 d = position - texelFetch(positions, before).xyz;
  v_colour = abs(d) / max(length(d), 1e-6);
  if (mode == 2) v_drop = is_start(gl_VertexID) ? 1 : 0;
}
"""
FRAGMENT = """
flat in vec3 v_colour;
flat in int v_drop;
out vec4 colour;
void main() {
  if (v_drop == 1) discard;
  colour = vec4(v_colour, 1.0);
}
"""


def compile_program(GL) -> int:
    vertex = VERTEX
    program = GL.glCreateProgram()
    for kind, body in ((GL.GL_VERTEX_SHADER, vertex), (GL.GL_FRAGMENT_SHADER, FRAGMENT)):
        shader = GL.glCreateShader(kind)
        GL.glShaderSource(shader, HEAD + body)
        GL.glCompileShader(shader)
        if not GL.glGetShaderiv(shader, GL.GL_COMPILE_STATUS):
            raise RuntimeError(GL.glGetShaderInfoLog(shader))
        GL.glAttachShader(program, shader)
    GL.glBindAttribLocation(program, 0, "position")
    GL.glLinkProgram(program)
    if not GL.glGetProgramiv(program, GL.GL_LINK_STATUS):
        raise RuntimeError(GL.glGetProgramInfoLog(program))
    return program


def make_points(n: int, n_points: int) -> np.ndarray:
    from tests.benchmarks.bench_render import synthetic_part

    rng = np.random.default_rng(0)
    out = np.empty((n * n_points, 3), np.float32)
    step = 100_000
    for lo in range(0, n, step):
        k = min(step, n - lo)
        out[lo * n_points : (lo + k) * n_points] = synthetic_part(k, n_points, rng)[0]
    return out


def buffer_of(GL, target, values: np.ndarray) -> int:
    buffer = GL.glGenBuffers(1)
    GL.glBindBuffer(target, buffer)
    GL.glBufferData(target, values.nbytes, None, GL.GL_STATIC_DRAW)
    flat = values.reshape(-1).view(np.uint8)
    chunk = 64 << 20
    for lo in range(0, flat.nbytes, chunk):
        part = flat[lo : lo + chunk]
        GL.glBufferSubData(target, lo, part.nbytes, part)
    GL.glBindBuffer(target, 0)
    return buffer


def texture_of(GL, buffer: int, internal_format) -> int:
    texture = GL.glGenTextures(1)
    GL.glBindTexture(GL.GL_TEXTURE_BUFFER, texture)
    GL.glTexBuffer(GL.GL_TEXTURE_BUFFER, internal_format, buffer)
    GL.glBindTexture(GL.GL_TEXTURE_BUFFER, 0)
    return texture


def vao_of(GL, buffer: int | None, stride: int = 12, offset: int = 0) -> int:
    vao = GL.glGenVertexArrays(1)
    GL.glBindVertexArray(vao)
    if buffer is not None:
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buffer)
        GL.glEnableVertexAttribArray(0)
        GL.glVertexAttribPointer(0, 3, GL.GL_FLOAT, GL.GL_FALSE, stride, ctypes.c_void_p(offset))
    GL.glBindVertexArray(0)
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
    return vao


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streamlines", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--frames", type=int, default=15)
    parser.add_argument("--size", type=int, nargs=2, default=(431, 455))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import vtk

    from tractlens.widgets.gl_fibre_program import load_gl, read_capabilities

    window = vtk.vtkRenderWindow()
    window.SetSize(*args.size)
    renderer = vtk.vtkRenderer()
    window.AddRenderer(renderer)
    window.Render()
    window.MakeCurrent()
    GL = load_gl()
    caps = read_capabilities(GL)
    print("context:", caps.words(), flush=True)

    n, m = args.streamlines, args.points
    start = time.perf_counter()
    points = make_points(n, m)
    made_s = time.perf_counter() - start
    total = len(points)
    offsets = np.arange(0, total + 1, m, dtype=np.int64)
    firsts = offsets[:-1].astype(np.int32)
    counts = np.diff(offsets).astype(np.int32)
    bits = np.zeros((total + 31) // 32 + 1, np.uint32)
    np.bitwise_or.at(bits, firsts >> 5, (np.uint32(1) << (firsts & 31).astype(np.uint32)))
    restart = np.full(total + n, 0xFFFFFFFF, np.uint32)
    slots = np.arange(total) + np.repeat(np.arange(n), counts)
    restart[slots] = np.arange(total, dtype=np.uint32)
    even = firsts % 2 == 0
    half_first = [(firsts[even] // 2).astype(np.int32), ((firsts[~even] - 1) // 2).astype(np.int32)]
    half_count = [((counts[even] + 1) // 2).astype(np.int32), ((counts[~even] + 1) // 2).astype(np.int32)]

    start = time.perf_counter()
    position = buffer_of(GL, GL.GL_ARRAY_BUFFER, np.concatenate([points, np.zeros((1, 3), np.float32)]))
    bits_buffer = buffer_of(GL, GL.GL_TEXTURE_BUFFER, bits)
    elements = buffer_of(GL, GL.GL_ELEMENT_ARRAY_BUFFER, restart)
    GL.glFinish()
    upload_s = time.perf_counter() - start
    del restart, slots
    positions_texture = texture_of(GL, position, GL.GL_RGB32F)
    starts_texture = texture_of(GL, bits_buffer, GL.GL_R32UI)
    vao = vao_of(GL, position)
    vao_even, vao_odd = vao_of(GL, position, 24, 0), vao_of(GL, position, 24, 12)
    vao_none = vao_of(GL, None)
    GL.glBindVertexArray(vao)
    GL.glBindBuffer(GL.GL_ELEMENT_ARRAY_BUFFER, elements)
    GL.glBindVertexArray(0)

    program = compile_program(GL)
    where = {name: GL.glGetUniformLocation(program, name) for name in ("mvp", "positions", "starts", "mode", "parity")}
    low, high = points.min(axis=0), points.max(axis=0)
    centre, half = (low + high) / 2, float((high - low).max()) / 2 * 1.05
    mvp = np.eye(4, dtype=np.float32)
    mvp[:3, :3] /= half
    mvp[:3, 3] = -centre / half
    mvp[2] *= 0.5  # inside the depth range

    outside = mvp.copy()
    outside[0, 3] += 10.0  # every point right of the clip volume: no fragment, the vertices still processed
    view = {"mvp": mvp, "size": tuple(args.size)}

    def setup(mode: int, parity: int = 0) -> None:
        GL.glViewport(0, 0, *view["size"])
        GL.glClearColor(0.1, 0.1, 0.1, 1.0)
        GL.glEnable(GL.GL_DEPTH_TEST)
        GL.glUseProgram(program)
        GL.glUniformMatrix4fv(where["mvp"], 1, GL.GL_TRUE, view["mvp"])
        GL.glUniform1i(where["mode"], mode)
        GL.glUniform1i(where["parity"], parity)
        GL.glActiveTexture(GL.GL_TEXTURE0)
        GL.glBindTexture(GL.GL_TEXTURE_BUFFER, positions_texture)
        GL.glUniform1i(where["positions"], 0)
        GL.glActiveTexture(GL.GL_TEXTURE1)
        GL.glBindTexture(GL.GL_TEXTURE_BUFFER, starts_texture)
        GL.glUniform1i(where["starts"], 1)

    def multi(mode=0):
        setup(mode)
        GL.glBindVertexArray(vao)
        GL.glMultiDrawArrays(GL.GL_LINE_STRIP, firsts, counts, n)

    def strip(mode=0):
        setup(mode)
        GL.glBindVertexArray(vao)
        GL.glDrawArrays(GL.GL_LINE_STRIP, 0, total)

    def restart_draw():
        setup(0)
        GL.glBindVertexArray(vao)
        GL.glEnable(GL.GL_PRIMITIVE_RESTART)
        GL.glPrimitiveRestartIndex(0xFFFFFFFF)
        GL.glDrawElements(GL.GL_LINE_STRIP, total + n, GL.GL_UNSIGNED_INT, None)
        GL.glDisable(GL.GL_PRIMITIVE_RESTART)

    def lines_pulled():
        setup(3)
        GL.glBindVertexArray(vao_none)
        GL.glDrawArrays(GL.GL_LINES, 0, 2 * (total - 1))

    def multi_half():
        for parity, array in ((0, vao_even), (1, vao_odd)):
            setup(4, parity)
            GL.glBindVertexArray(array)
            GL.glMultiDrawArrays(GL.GL_LINE_STRIP, half_first[parity], half_count[parity], len(half_first[parity]))

    def points_only():
        setup(0)
        GL.glBindVertexArray(vao)
        GL.glDrawArrays(GL.GL_POINTS, 0, total)

    def elsewhere(mvp_used, size, draw):
        def run():
            view["mvp"], view["size"] = mvp_used, size
            try:
                draw()
            finally:
                view["mvp"], view["size"] = mvp, tuple(args.size)

        return run

    ways = {
        "multi": multi,
        "multi_outside": elsewhere(outside, tuple(args.size), multi),
        "multi_16px": elsewhere(mvp, (16, 16), multi),
        "points": points_only,
        "multi_plain": lambda: multi(1),
        "strip": strip,
        "restart": restart_draw,
        "strip_bits": lambda: strip(2),
        "lines_pulled": lines_pulled,
        "multi_half": multi_half,
    }
    results: dict = {
        "context": caps.words(),
        "streamlines": n,
        "points": total,
        "window": list(args.size),
        "made_s": round(made_s, 2),
        "upload_s": round(upload_s, 2),
        "ways": {},
    }
    pixels = {}
    for name, draw in ways.items():
        frames, calls = [], []
        for k in range(args.frames + 3):
            GL.glClear(GL.GL_COLOR_BUFFER_BIT | GL.GL_DEPTH_BUFFER_BIT)
            GL.glFinish()
            t0 = time.perf_counter()
            draw()
            t1 = time.perf_counter()
            GL.glFinish()
            t2 = time.perf_counter()
            GL.glBindVertexArray(0)
            if k >= 3:
                frames.append(t2 - t0)
                calls.append(t1 - t0)
        image = np.frombuffer(GL.glReadPixels(0, 0, *args.size, GL.GL_RGB, GL.GL_UNSIGNED_BYTE), np.uint8)
        lit = image.reshape(-1, 3).max(axis=1) > 40
        pixels[name] = lit
        row = {
            "frame_ms": round(1e3 * statistics.median(frames), 2),
            "frame_min_ms": round(1e3 * min(frames), 2),
            "call_ms": round(1e3 * statistics.median(calls), 2),
            "lit_pixels": int(lit.sum()),
        }
        results["ways"][name] = row
        print(f"{name:>13}: {row}", flush=True)
    reference = pixels["multi"]
    for name, lit in pixels.items():
        results["ways"][name]["lit_differs_from_multi"] = int(np.count_nonzero(lit != reference))
    text = json.dumps(results, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
