"""What the window's OpenGL context is, and how the fibre layer draws on it (issue 41).

    python tests/benchmarks/gl_probe.py [--out FILE] [--streamlines 2000]

Opens the main window (its 3-D view's context, as the app makes it; starts its own Xvfb when
there is no display), draws one frame and prints, as JSON: the vendor, renderer, version and
GLSL version strings, GL_MAJOR/MINOR_VERSION as PyOpenGL returns them (type and value), the
profile mask, GL_MAX_TEXTURE_BUFFER_SIZE (raw and as used), whether ARB_texture_buffer_object_rgb32
and ARB_shader_draw_parameters are there, and, after drawing a small synthetic tractogram from
the view's own buffers, which program the fibre layer chose and why (``fibre_program``,
``fibre_program_why``), or why it fell back to VTK (``fibre_gl_failed``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def raw(value) -> dict:
    """A PyOpenGL answer as it came: its Python type and value."""
    return {"type": type(value).__name__, "value": repr(value)}


def probe(n_streamlines: int) -> dict:
    import numpy as np

    from tests.benchmarks.bench_render import synthetic_part
    from tests.benchmarks.render_measure import bench_window
    from tractlens.app.model import Layer, Tractogram
    from tractlens.widgets import gl_fibers, gl_fibre_program, view3d_fibers

    app, window = bench_window(800, 600, "gl-probe-config-")
    view = window.view3d
    view.plotter.render()
    ren_win = view.plotter.ren_win
    out: dict = {"vtk_window": ren_win.GetClassName(), "pyopengl_platform": os.environ.get("PYOPENGL_PLATFORM")}
    out["glx_vendor_library"] = os.environ.get("__GLX_VENDOR_LIBRARY_NAME")
    out["vtk_version_string"] = view3d_fibers.gl_version(ren_win)
    GL = gl_fibers.load_gl()
    import OpenGL

    out["pyopengl"] = OpenGL.__version__
    out["pyopengl_platform_class"] = type(OpenGL.platform.PLATFORM).__name__
    ren_win.MakeCurrent()
    for name in ("GL_MAJOR_VERSION", "GL_MINOR_VERSION", "GL_CONTEXT_PROFILE_MASK", "GL_MAX_TEXTURE_BUFFER_SIZE"):
        try:
            out[name] = raw(GL.glGetIntegerv(getattr(GL, name)))
        except Exception as error:  # reported
            out[name] = {"error": repr(error)}
    caps = gl_fibre_program.read_capabilities(GL)
    out["capabilities"] = {
        "vendor": caps.vendor,
        "renderer": caps.renderer,
        "version_string": caps.version_string,
        "glsl_version": caps.glsl_version,
        "queried_version": caps.queried_version,
        "version_used": caps.version,
        "profile": caps.profile,
        "max_texture_buffer_texels": caps.max_texture_buffer_texels,
        "rgb32f_texture_buffers": caps.rgb32f_texture_buffers,
        "draw_ids": caps.draw_ids,
        "n_extensions": len(caps.extensions),
        "ARB_texture_buffer_object_rgb32": "GL_ARB_texture_buffer_object_rgb32" in caps.extensions,
        "ARB_shader_draw_parameters": "GL_ARB_shader_draw_parameters" in caps.extensions,
        "errors": list(caps.errors),
    }

    # A small tractogram drawn from the view's own buffers: the program the layer chooses, and why.
    view3d_fibers.GL_LAYER_MIN_POINTS = 1
    view._software_rendering = None  # read again, with the lowered size
    points, weight = synthetic_part(n_streamlines, 40, np.random.default_rng(0))
    from tests.benchmarks.bench_render import AFFINE, GRID_SHAPE

    offsets = np.arange(0, len(points) + 1, 40, dtype=np.int64)
    voxels = ((points - AFFINE[:3, 3]) / AFFINE[0, 0]).astype(np.float32)
    tract = Tractogram(voxels, offsets, AFFINE, GRID_SHAPE, streamline_scalars={"weight": weight}, name="probe")
    layer = Layer("probe", tract, "tractogram")
    window.document.add_layer(layer)
    for _ in range(20):
        app.processEvents()
    view.reset_camera()
    view._full_detail()
    scene = view._fibers[id(layer)]["scene"]
    out["fibre_drawing"] = type(scene).__name__
    out["fibre_gl_failed"] = getattr(scene, "failed", None) or getattr(view, "gl_layer_refused", None)
    gl = getattr(scene, "gl", None)
    if gl is not None and gl.program is not None:
        kind, why = gl.program_choice()
        out["fibre_program"], out["fibre_program_why"] = kind, why
        out["pulled_refusal"] = gl.program.pulled_refusal
        out["programs_compiled"] = sorted(gl.program.programs)
        out["streamline_scalars_by_draw_id"] = gl.program.draw_ids
    window.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--streamlines", type=int, default=2000)
    args = parser.parse_args()
    result = probe(args.streamlines)
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
