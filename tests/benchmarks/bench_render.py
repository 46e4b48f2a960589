"""Benchmark: the window at whole-brain scale (issue 41): open, rotate, rest, select, glyphs.

    python tests/benchmarks/bench_render.py [--counts 1000000 10000000] [--points 100]
        [--cache DIR] [--size 1600x1000] [--frames 20] [--device auto] [--fibres own|vtk] [--out FILE]

For each N a synthetic whole-brain ``.trx`` (N streamlines of ``--points`` points, smooth curves
in a 1.25 mm brain-sized grid, float32 positions and a per-streamline ``weight``) is written once
into the cache folder, streamed part by part (vectorised, never whole in memory). Each N then runs
in a fresh process (so its peak memory is its own), in a 1600×1000 main window with a reference
image and a tensor layer on the 1.25 mm grid:

- ``open_to_first_frame_s``: the window's own open (the loading job on a worker: read, display
  arrays) until the end of the first frame with fibres in it, drawn by the window itself (an
  observer of the render window; drawn to the GPU's end), what it showed in
  ``first_frame_lod_text``. Until session 14 this was the script's own frame after the layer
  came (``open_to_script_frame_s``), by which time the window had drawn several more pieces;
- ``rotate_ms``: median frame time while the camera turns (3° per frame) with the level of detail
  it states (``rotate_lod_text``); measured before (``rotate``) and after (``rotate_after_rest``)
  the view has timed a full frame at rest (a fast full frame makes it draw all while moving);
- ``rest_ms``: median frame time at rest, and what it draws (``rest_lod_text``: empty when all);
- ``colour_change_ms``: direction -> COMMIT-like weight -> direction, frame included (no points rebuilt);
- ``rss_*``: resident memory (``/proc/self/status``) before opening, its peak (VmHWM) and after,
  against the file size (``rss_peak_over_file``, ``rss_added_over_file``: added by the open);
  ``rss_anon_file_by_step_mb``: anonymous and file-backed resident memory at the end of each
  step (the mapped ``.trx``'s pages are the latter: the page cache's, given back under pressure);
  ``rss_peak_by_step_mb``: the peak of each step (load with the first frame and the check, all drawn, rotate/rest/colour,
  selection, glyphs), VmHWM being reset between steps;
- ``fibre_drawing``: ``GLFiberActors`` (the view's own OpenGL buffers, ``--fibres own``, the
  default) or ``FiberActors`` (VTK's mapper, ``--fibres vtk``), and why not the former if not;
- ``select_*``: an ROI edit (a 12 mm sphere moved by 3 voxels) -> the selection drawn, split into
  the selection (``app.selection.select_fibres``, GPU when there is one), the index ranges
  (``prepare_selection``) and the GUI's swap + frame; the first edit also builds the streamline
  index; ``slice_fibres_ready_ms``: until the slice views' segments (drawn by a worker for a
  whole-brain tractogram) are shown too; ``roi_edit_ms``: the same through the window (an ROI
  moved by brush strokes, the tractogram filtered by ROIs: the throttle, the selection job, the
  swap, until the 3-D frame; ``roi_edit_settled_ms``: until the window is flushed), from
  ``render_roi.py``;
- ``glyph_step_ms``: tensor glyphs of the three cursor planes rebuilt after a one-voxel step of
  the cursor, until drawn (median of several steps, ``BENCH_STEP_PAUSE_S`` apart: the neighbours'
  glyphs are built ahead meanwhile, ``glyph_step_made_ahead`` says for which steps), and
  ``glyph_jump_ms`` for five-voxel jumps (built while the jump waits), with the glyph count (the
  fibres hidden first: ``rss_hiding_fibres_mb``; ``glyph_step_rss_mb``: the memory after each step);
  ``--glyphs-as-hardware`` asks software OpenGL for the hardware count (whole slices);
- ``fod_glyph_step_ms``: the same for an fODF layer (lmax 8, a lobe per voxel of the same
  ellipsoid; one mesh of SH surfaces), after the memory figures (``BENCH_FOD=0``: not run), with
  ``fod_glyph_count`` (surface vertices) and ``fod_glyph_step_parts``;
- ``gui_swap_parts``, ``colour_change_parts``, ``glyph_step_parts``: where the GUI thread's time
  of a step went: the three slice views' paints (``slice_views_ms``), the 3-D frames
  (``frames_3d_ms``), the fibre layer's uploads (``gl_*_ms``: per-streamline values, drawn ids,
  per-point scalars), the rest (``other_ms``), and with ``BENCH_WINDOW_UPDATES=1`` the window's
  updates (``window_updates``: each paints the dirty widgets, then composes and flushes the
  window) and what they took besides the paints and frames (``window_update_compose_ms``, within
  ``other_ms``; off by default: timing them holds Python's lock through every compose, which
  slows the workers a step waits for); for glyphs also the build's wait for a worker, the
  build, its way to the GUI thread and its delivery (``build_*_ms``);
- ``fibre_program``, ``fibre_program_why``: which shader program draws the fibres and why
  (vertex pulling or the geometry shader), ``fibre_streamline_scalars_by_draw_id``: whether a
  per-streamline scalar is read by ``gl_DrawID`` (one value per streamline on the GPU).

The GL vendor/renderer string says whether OpenGL is hardware (NVIDIA) or software (llvmpipe).
Also: the open split into the loading job and the first frame (``open_load_job_s``,
``open_first_frame_s``; a tractogram drawn in pieces shows its first piece first, stated in
``first_frame_lod_text``, and ``open_to_all_drawn_s`` is when every piece is drawn; a ``.trx``'s
positions check runs after the loading job, beside the first frame: ``open_to_checked_s``; ``jobs``:
each job's start and end), whether the
file's positions stayed memory-mapped and no voxel copy was made (``positions_mapped``,
``voxel_copy_made_by_open``; ``bench_fibre_load.py`` splits the loading job step by step),
resident memory after the loading job (before OpenGL has anything,
``rss_added_by_load_over_file``), our display arrays (``display_arrays_mb``), the vertex
buffers (pieces) drawn and the selection's device (``select_device``).

Results: one JSON line per N, and after each N ``--out`` (default
``<--out-dir>/render_<gl>.json``, ``<gl>`` the GPU model such as ``h100``, or ``nvidia``,
``llvmpipe``) with the command line. ``--budget-s`` (or ``BENCH_BUDGET_S``) stops a size's
process when the whole run would pass it (the row then says so). Starts its own Xvfb when there
is no display. ``BENCH_PROFILE=DIR``: the GUI thread's profile of the colour changes, the ROI
edits and the glyph steps, as text in DIR (``profile_<N>_<step>.txt``). ``BENCH_TRACEMALLOC=1``:
the sites that still hold memory the first ROI edit allocated (``select_first_allocations``;
traced allocations slow that edit, not the second).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GRID_SHAPE = (145, 174, 145)  # a 1.25 mm brain grid (HCP-like)
VOXEL_MM = 1.25
AFFINE = np.array(
    [[VOXEL_MM, 0, 0, -90.0], [0, VOXEL_MM, 0, -126.0], [0, 0, VOXEL_MM, -72.0], [0, 0, 0, 1]], dtype=np.float64
)
PART_STREAMLINES = 200_000

from tests.benchmarks.render_glyphs import fod_scene_layer, glyph_steps  # noqa: E402 - after the path is set
from tests.benchmarks.render_measure import (  # noqa: E402 - after the path is set
    FINISH,
    StepClock,
    anon_and_file_mb,
    frames,
    ms,
    profiled,
    reset_peak_rss,
    rss_kb,
    settle,
    submitted,
    traced_allocations,
    wait,
)
from tests.benchmarks.render_roi import RADIUS_MM, roi_edits, sphere  # noqa: E402 - after the path is set


def synthetic_tractogram(n_streamlines: int, n_points: int = 50, seed: int = 0):
    """Slightly bent straight streamlines in a 100 mm cube, identity affine, in memory: the input
    of bench_select, bench_connectivity, bench_cpu_peers' selection row and crossover_methods."""
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(seed)
    start = rng.uniform(0, 100, (n_streamlines, 1, 3)).astype(np.float32)
    direction = rng.normal(size=(n_streamlines, 1, 3)).astype(np.float32)
    direction /= np.linalg.norm(direction, axis=2, keepdims=True)
    bend = rng.normal(scale=0.02, size=(n_streamlines, 1, 3)).astype(np.float32)
    t = np.arange(n_points, dtype=np.float32)[None, :, None]
    points = start + direction * t + bend * t**2
    offsets = np.arange(0, n_streamlines * n_points + 1, n_points, dtype=np.int64)
    return Tractogram(points.reshape(-1, 3), offsets, np.eye(4), (100, 100, 100), name=f"{n_streamlines}")


def synthetic_part(n: int, n_points: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(points (n·n_points, 3) float32 RAS mm, weight (n,)): smooth curves through a brain-sized
    ellipsoid, 1 mm steps, vectorised."""
    centre = (AFFINE[:3, :3] @ (np.array(GRID_SHAPE) / 2) + AFFINE[:3, 3]).astype(np.float32)
    radii = np.array([55.0, 70.0, 50.0], np.float32)
    direction = rng.normal(size=(n, 3)).astype(np.float32)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    middle = centre + rng.uniform(-0.6, 0.6, (n, 3)).astype(np.float32) * radii
    bend = rng.normal(scale=0.004, size=(n, 3)).astype(np.float32)
    t = np.arange(n_points, dtype=np.float32) - np.float32(n_points / 2)
    points = middle[:, None, :] + direction[:, None, :] * t[None, :, None] + bend[:, None, :] * t[None, :, None] ** 2
    return points.reshape(-1, 3), rng.uniform(0.0, 1.0, n).astype(np.float32)


def synthetic_trx(folder: Path, n_streamlines: int, n_points: int = 100, seed: int = 0, dtype: str = "float32") -> Path:
    """The cached synthetic .trx of ``n_streamlines`` (written once, part by part), its positions
    of ``dtype`` (float32 or float16)."""
    from tractlens.app.io.tractogram_stream import open_tractogram_writer
    from tractlens.app.model import Tractogram

    path = folder / f"synthetic_{n_streamlines}x{n_points}{'' if dtype == 'float32' else '_' + dtype}.trx"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    with open_tractogram_writer(path, AFFINE, GRID_SHAPE, points_in_mm=True, positions_dtype=dtype) as writer:
        for first in range(0, n_streamlines, PART_STREAMLINES):
            n = min(PART_STREAMLINES, n_streamlines - first)
            points, weight = synthetic_part(n, n_points, rng)
            offsets = np.arange(0, n * n_points + 1, n_points, dtype=np.int64)
            writer.append(Tractogram(points, offsets, AFFINE, GRID_SHAPE, streamline_scalars={"weight": weight}))
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return path


def scene_layers(document):
    """A reference image and a tensor layer on the 1.25 mm grid (the glyphs' data)."""
    from tractlens.app.model import Layer
    from tractlens.app.volumes import Volume

    shape = GRID_SHAPE
    grid = np.indices(shape, dtype=np.float32)
    inside = sum(((grid[a] - shape[a] / 2) / (0.42 * shape[a])) ** 2 for a in range(3)) <= 1.0
    del grid
    image = np.where(inside, np.float32(0.5), np.float32(0.0))
    document.add_layer(Layer("image", Volume("image", image, AFFINE), "scalar"))
    rng = np.random.default_rng(1)
    tensor = np.zeros((*shape, 6), np.float32)
    v = rng.normal(size=(int(inside.sum()), 3)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    lam = np.float32(1.7e-3), np.float32(0.3e-3)
    outer = v[:, :, None] * v[:, None, :] * (lam[0] - lam[1])
    tensor[inside] = np.stack([outer[:, 0, 0], outer[:, 0, 1], outer[:, 0, 2], outer[:, 1, 1], outer[:, 1, 2],
                               outer[:, 2, 2]], 1) + lam[1] * np.array([1, 0, 0, 1, 0, 1], np.float32)  # fmt: skip
    layer = Layer("tensors", Volume("tensors", tensor, AFFINE, kind="tensor"), "tensor")
    document.add_layer(layer)
    return layer


def one_size(path: Path, size: str, n_frames: int, device: str, glyphs_as_hardware: bool = False) -> dict:
    import tempfile

    from tests.conftest import _ensure_display

    os.environ.setdefault("TRACTLENS_CONFIG_DIR", tempfile.mkdtemp(prefix="bench-render-config-"))  # not the user's
    _ensure_display()
    from PySide6.QtWidgets import QApplication

    from tractlens.app.model import Layer
    from tractlens.app.selection import RoiSelection, select_fibres, streamline_index
    from tractlens.app.volumes import RoiMask
    from tractlens.widgets.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    clock = StepClock()  # (before the window: its slice views' paints are timed)
    window = MainWindow(device=device, autosave_s=0)  # the autosave is measured apart, at the end
    width, height = (int(v) for v in size.split("x"))
    window.resize(width, height)
    window.show()
    app.processEvents()
    view, doc = window.view3d, window.document
    view.finish_frames = FINISH  # every frame's recorded end is when the GPU has drawn it
    plotter = view.plotter
    tensors = scene_layers(doc)
    tensors.set(visible=False)
    assert window.wait_for_jobs(600)
    app.processEvents()
    view._software()  # reads the OpenGL renderer string
    row: dict = {"file": str(path), "file_bytes": path.stat().st_size, "gl_renderer": view.gl_renderer}
    row["view_px"] = [view.width(), view.height()]
    row["fibres_gl_env"] = os.environ.get("TRACTLENS_FIBRES_GL", "1")
    row["frames_timed_to_gpu_done"] = FINISH
    rss_before = rss_kb()
    peaks = {}  # the peak resident memory of each step (MB), where the kernel lets it be reset
    split = {}  # at the end of each step: (anonymous, file-backed) resident MB (a mapped file's pages are the latter)
    resettable = reset_peak_rss()

    # Open: the window's own loading job, then the first frame with the fibres.
    run_jobs: list[dict] = []

    def job_done(job_id: int, _result=None) -> None:  # each job's start and end, from the start of the open
        job = window.runner.jobs.get(job_id)
        if job is not None and len(run_jobs) < 50:
            now = time.perf_counter()
            run_jobs.append({"name": job.name, "started_s": round(job.started_at - start, 3),
                              "done_s": round(now - start, 3)})  # fmt: skip

    window.runner.job_finished.connect(job_done)
    # The first frame with fibres on screen, whatever runs it (the window's own first piece, not
    # this script's frame below: waiting for the layer lets the window draw more pieces first).
    first_fibre_frame: dict = {}

    def frame_ended(*_args) -> None:  # after the view's own observer (lower priority): drawn to the end
        if first_fibre_frame:
            return
        for entry in view._fibers.values():
            gl = getattr(entry["scene"], "gl", None)
            if gl is None or gl.uploaded:
                first_fibre_frame.update(at=time.perf_counter(), lod_text=view.lod_text())
                return

    observer = plotter.ren_win.AddObserver("EndEvent", frame_ended, -1.0)
    start = time.perf_counter()
    window.open_paths([path])
    # The layer is added when the loading job ends; a .trx's positions check runs after it, as
    # a job of its own, while the first frame is drawn (the 3-D view does not wait for it, the
    # slice views do): the first frame is timed from the loading job, the check apart.
    tractograms = lambda: [layer for layer in doc.layers if layer.kind == "tractogram"]  # noqa: E731
    assert wait(app, lambda: tractograms() or not window.runner.jobs, 3600) and tractograms(), "open failed"
    loaded = time.perf_counter()
    row["rss_after_load_mb"] = round(rss_kb() / 1024)  # the tractogram and its display arrays, before GL
    layer = tractograms()[0]
    assert wait(app, lambda: id(layer) in view._fibers, 600)
    view._render_now()
    app.processEvents()
    plotter.render()
    plotter.ren_win.RemoveObserver(observer)
    at = first_fibre_frame.get("at", time.perf_counter())
    row["open_to_first_frame_s"] = round(at - start, 2)
    row["open_load_job_s"] = round(loaded - start, 2)  # read + display arrays (the loading job)
    row["open_first_frame_s"] = round(at - loaded, 2)  # actors + upload + first draw
    row["first_frame_lod_text"] = first_fibre_frame.get("lod_text", view.lod_text())
    # what sessions 7-13 reported as the first frame: this script's own frame after the layer came
    row["open_to_script_frame_s"] = round(time.perf_counter() - start, 2)
    row["script_frame_lod_text"] = view.lod_text()
    assert window.wait_for_jobs(3600), "the positions check failed"
    row["open_to_checked_s"] = round(time.perf_counter() - start, 2)  # the positions check ended too
    row["jobs"] = run_jobs  # every job of the run (the load, the positions check, selections...): its span
    peaks["load"] = round(rss_kb("VmHWM") / 1024)  # the load, the first frame and the check
    split["load"] = anon_and_file_mb()
    resettable and reset_peak_rss()
    scene = view._fibers[id(layer)]["scene"]
    row["fibre_drawing"] = type(scene).__name__  # GLFiberActors: the view's own buffers; FiberActors: VTK
    row["fibre_gl_failed"] = getattr(scene, "failed", None) or getattr(view, "gl_layer_refused", None)
    gl = getattr(scene, "gl", None)
    if gl is not None and hasattr(gl, "program_choice") and gl.program is not None:  # which program, and why
        row["fibre_program"], row["fibre_program_why"] = gl.program_choice()
        row["fibre_streamline_scalars_by_draw_id"] = bool(getattr(gl.program, "draw_ids", False))
    assert wait(app, lambda: not any(entry["scene"].filling for entry in view._fibers.values()), 600)
    plotter.render()
    row["open_to_all_drawn_s"] = round(time.perf_counter() - start, 2)
    row["streamlines"], row["points"] = len(layer.data), int(layer.data.offsets[-1])
    mapped = getattr(layer.data, "mapped", None)  # a .trx opened memory-mapped (app.tractogram.MappedPoints)
    row["positions_mapped"] = mapped is not None
    row["voxel_copy_made_by_open"] = None if mapped is None else mapped.made  # False: none made to draw
    row["rss_after_open_mb"] = round(rss_kb() / 1024)
    arrays = doc.fiber_arrays.prepare(layer)
    row["vertex_buffers"] = len(arrays.bounds)
    direction = arrays.given_direction  # None: not made (coloured by direction in a shader)
    ours = {"points": arrays.points.nbytes, "direction_rgba": 0 if direction is None else direction.nbytes,
            "offsets": arrays.offsets.nbytes}  # fmt: skip
    ours["levels"] = sum(c.offsets.nbytes + (0 if c.stored is None else c.stored.nbytes) + sum(
        p.offsets.nbytes + (0 if p.stored is None else p.stored.nbytes) for p in (c._pieces or ((), ()))[1])
        for c in arrays.levels.values())  # fmt: skip
    row["display_arrays_mb"] = {k: round(v / 2**20) for k, v in ours.items()}
    view.reset_camera()
    peaks["all_drawn"] = round(rss_kb("VmHWM") / 1024)
    split["all_drawn"] = anon_and_file_mb()
    resettable and reset_peak_rss()

    # Rotate with the stated level of detail, rest, rotate again (the view has timed a full frame).
    view._coarse_detail()
    row["rotate_submitted_ms"] = ms(submitted(view, n_frames))  # the render calls alone, not drawn to the end
    row["rotate_ms"] = ms(frames(plotter, n_frames))
    row["rotate_lod_text"] = view.lod_text()
    view._full_detail()
    # A full frame over the moving budget asks a worker for every streamline simplified within
    # 0.1 mm (widgets.fibre_simplifier): drawn at rest, and while moving when its frame allows.
    start = time.perf_counter()
    row["simplified_in_time"] = wait(app, view.simplified_ready, 300)
    row["simplify_wait_s"] = round(time.perf_counter() - start, 2)
    simplifier = view._simplifier
    simple = simplifier.cells.get(id(layer))
    row["simplified_points"] = None if simple is None else simple.n_points
    row["simplify_s"] = round(simplifier.seconds.get(id(layer), 0.0), 2)
    row["simplified_frame_ms"] = None if simplifier.frame_s is None else round(1e3 * simplifier.frame_s, 1)
    row["rest_ms"] = ms(frames(plotter, 3, 1.0))
    row["rest_lod_text"] = view.lod_text()
    row["full_frame_s_measured"] = view._full_frame_s
    view._coarse_detail()
    row["rotate_after_rest_submitted_ms"] = ms(submitted(view, n_frames))
    row["rotate_after_rest_ms"] = ms(frames(plotter, n_frames))
    row["rotate_after_rest_lod_text"] = view.lod_text()
    view._full_detail()

    # Colour by a per-streamline weight and back: lookup-table changes, the points untouched.
    points_before = view._fibers[id(layer)]["scene"].points
    times, parts = [], []
    for colour in ("weight", "direction"):
        clock.start(view)
        start = time.perf_counter()
        with profiled(f"colour_{colour}_{len(times)}", len(layer.data)):
            if colour == "weight":
                layer.set(color_by="weight", colormap="viridis", clim=(0.0, 1.0))
            else:
                layer.set(color_by="direction")
            settle(app)  # the view's own repaint draws the frame
        times.append(time.perf_counter() - start)
        parts.append(clock.parts(view))
    row["colour_change_ms"] = [round(1e3 * t, 1) for t in times]  # the 2-D views repaint too
    row["colour_change_parts"] = parts
    row["colour_change_rebuilt_points"] = view._fibers[id(layer)]["scene"].points is not points_before
    peaks["rotate_rest_colour"] = round(rss_kb("VmHWM") / 1024)
    split["rotate_rest_colour"] = anon_and_file_mb()
    resettable and reset_peak_rss()

    # ROI edit -> selection drawn: select (worker), index ranges (worker), swap + frame (GUI).
    for edit, shift in enumerate((0, 3)):
        mask = sphere(GRID_SHAPE, np.array(GRID_SHAPE) / 2 + shift, RADIUS_MM / VOXEL_MM)
        roi = Layer("sphere", RoiMask("sphere", mask, AFFINE, role="target"), "roi")
        request = RoiSelection((layer,), (mask,), (), AFFINE, ("sphere",))
        anon = [anon_and_file_mb()[0]]  # anonymous resident MB before and after each part
        traced = edit == 0 and traced_allocations()
        with profiled(f"select_{edit}", len(layer.data)):
            t0 = time.perf_counter()
            ((_, selected),) = select_fibres(doc, request, device=device)
            t1 = time.perf_counter()
            anon.append(anon_and_file_mb()[0])
            row["select_device"] = streamline_index(doc, layer, AFFINE, device).backend.name
            doc.fiber_arrays.prepare_selection(layer, selected)
            clock.start(view)
            t2 = time.perf_counter()
            anon.append(anon_and_file_mb()[0])
            layer.set_selection(selected, by=request.by)
            settle(app)
            t3 = time.perf_counter()
            anon.append(anon_and_file_mb()[0])
        swap_parts = clock.parts(view)
        # a whole-brain tractogram's segments on the slice views come from a worker, after the frame
        wait(app, lambda: all(v._fibres.ready() for v in window.views.values()), 60)
        t4 = time.perf_counter()
        anon.append(anon_and_file_mb()[0])
        if traced:
            row["select_first_allocations"] = traced_allocations(stop=True)
        key = "select_first" if edit == 0 else "select"
        row[key] = {
            "selected": int(selected.sum()),
            "select_ms": round(1e3 * (t1 - t0), 1),
            "index_ranges_ms": round(1e3 * (t2 - t1), 1),
            "gui_swap_and_frame_ms": round(1e3 * (t3 - t2), 1),
            "gui_swap_parts": swap_parts,  # slice views' paints, 3-D frames, uploads, the rest
            "total_ms": round(1e3 * (t3 - t0), 1),
            # ROI edit -> the new selection's first 3-D frame done (select, ranges, until that frame)
            "to_3d_frame_ms": None
            if swap_parts["first_frame_done_ms"] is None
            else round(1e3 * (t2 - t0) + swap_parts["first_frame_done_ms"], 1),
            "slice_fibres_ready_ms": round(1e3 * (t4 - t0), 1),  # the slice views' segments drawn too
            # anonymous resident MB added by the selection, the index ranges, the swap and frame,
            # and until the slice views' segments were drawn
            "anon_added_mb": [b - a for a, b in itertools.pairwise(anon)],
        }
        del roi
    layer.set_selection(None)
    settle(app)
    peaks["selection"] = round(rss_kb("VmHWM") / 1024)
    split["selection"] = anon_and_file_mb()
    resettable and reset_peak_rss()

    # ROI edits through the window: the throttle, the selection job and the swap, as a user meets them.
    row.update(roi_edits(app, window, layer, clock, GRID_SHAPE, AFFINE, VOXEL_MM))

    # Glyphs: three cursor planes of tensor glyphs rebuilt after each one-voxel step.
    before_hiding = round(rss_kb() / 1024)
    layer.set(visible=False)
    settle(app)
    row["rss_hiding_fibres_mb"] = [before_hiding, round(rss_kb() / 1024)]  # what hiding them does to memory
    if glyphs_as_hardware:  # software OpenGL asked for the hardware glyph count (a whole slice): its CPU side
        view._software = lambda: False
        row["glyphs_as_hardware"] = True
    tensors.set(visible=True)
    row.update(glyph_steps(app, window, tensors, clock, "glyph", len(layer.data)))

    row["rss_before_open_mb"] = round(rss_before / 1024)
    peaks["glyphs"] = round(rss_kb("VmHWM") / 1024)
    split["glyphs"] = anon_and_file_mb()
    row["rss_peak_by_step_mb"] = peaks if resettable else None
    row["rss_anon_file_by_step_mb"] = split
    row["rss_peak_mb"] = max(peaks.values()) if resettable else round(rss_kb("VmHWM") / 1024)
    row["rss_end_mb"] = round(rss_kb() / 1024)
    file_mb = path.stat().st_size / 2**20
    row["rss_peak_over_file"] = round(row["rss_peak_mb"] / file_mb, 2)
    row["rss_added_over_file"] = round((row["rss_after_open_mb"] - row["rss_before_open_mb"]) / file_mb, 2)
    row["rss_added_by_load_over_file"] = round((row["rss_after_load_mb"] - row["rss_before_open_mb"]) / file_mb, 2)
    row["rss_peak_added_over_file"] = round((row["rss_peak_mb"] - row["rss_before_open_mb"]) / file_mb, 2)

    # What an autosave (or File > Save session) of this document costs: sessions keep tractograms
    # exactly, as float64 .trx side files.
    if os.environ.get("BENCH_SESSION_SAVE", "1") == "1":
        import tempfile

        from tractlens.app.session import save_session

        with tempfile.TemporaryDirectory(dir=path.parent) as folder:
            start = time.perf_counter()
            save_session(doc, Path(folder) / "session")
            row["session_save_s"] = round(time.perf_counter() - start, 1)
        row["rss_peak_with_session_save_mb"] = round(rss_kb("VmHWM") / 1024)
    # fODF glyphs (SH surfaces, one mesh), after the memory figures: their volume is 0.66 GB
    if os.environ.get("BENCH_FOD", "1") == "1":
        tensors.set(visible=False)
        fods = fod_scene_layer(doc, GRID_SHAPE, AFFINE)
        row.update(glyph_steps(app, window, fods, clock, "fod_glyph", len(layer.data)))
    row["gl_renderer"] = view.gl_renderer
    window.close()
    return row


def renderer_kind(gl: str) -> str:
    """The results file's name part: the GPU model (h100, h200), nvidia, llvmpipe or other."""
    upper = gl.upper()
    for model in ("H100", "H200", "A100", "L40S"):
        if model in upper:
            return model.lower()
    return "nvidia" if "NVIDIA" in upper else "llvmpipe" if "llvmpipe" in gl else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("TRACTLENS_BENCH_CACHE", "/tmp/tractlens-bench"))
    )
    parser.add_argument("--size", default="1600x1000")
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--fibres", choices=["own", "vtk"], default="own",
                        help="draw tractograms from the view's own OpenGL buffers (own) or with VTK's mapper (vtk)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="results file (default: render_<gl>.json in --out-dir)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "benchmarks" / "results")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("BENCH_BUDGET_S", "0")) or None,
                        help="stop a size's process when the whole run would pass this many seconds")  # fmt: skip
    parser.add_argument("--glyphs-as-hardware", action="store_true",
                        help="the glyph step with the hardware glyph count (whole slices) on any OpenGL")  # fmt: skip
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # a child: one file
    args = parser.parse_args()
    if args.one is not None:
        row = one_size(args.one, args.size, args.frames, args.device, args.glyphs_as_hardware)
        print("RESULT " + json.dumps(row), flush=True)
        return
    began = time.perf_counter()
    rows: list[dict] = []
    for n in args.counts:
        path = synthetic_trx(args.cache, n, args.points)
        command = [sys.executable, __file__, "--one", str(path), "--size", args.size, "--frames", str(args.frames),
                   "--device", args.device] + (["--glyphs-as-hardware"] if args.glyphs_as_hardware else [])  # fmt: skip
        left = None if args.budget_s is None else max(1.0, args.budget_s - (time.perf_counter() - began))
        try:
            env = {**os.environ, "TRACTLENS_FIBRES_GL": "1" if args.fibres == "own" else "0"}
            done = subprocess.run(command, capture_output=True, text=True, timeout=left, env=env)
            stdout, stderr, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:
            stdout, stderr, code = expired.stdout or "", expired.stderr or "", f"stopped after {left:.0f} s (budget)"
            stdout, stderr = (v.decode() if isinstance(v, bytes) else v for v in (stdout, stderr))
        line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            row = {"streamlines": n, "error": (stderr or stdout)[-3000:], "returncode": code}
        else:
            row = json.loads(line[len("RESULT ") :])
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_results(args, rows)  # after every size: a later one that fails or runs out of time keeps these


def write_results(args, rows: list[dict]) -> None:
    gl = next((row["gl_renderer"] for row in rows if row.get("gl_renderer")), "unknown")
    suffix = "" if args.fibres == "own" else "_vtk"
    out = args.out or args.out_dir / f"render_{renderer_kind(gl)}{suffix}.json"
    summary = {
        "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
        "gl_renderer": gl,
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
