"""bench_render.py's glyph steps (issue 41: whole-slice glyphs within 100 ms a slice step): the
cursor steps one voxel along z, y and x in turn (twice each), at a reader's pace (``BENCH_STEP_PAUSE_S``
between steps, default 0.3 s: the 3-D view builds the neighbouring positions' glyphs ahead
meanwhile, :mod:`widgets.glyph_prefetch`), and then jumps five voxels along z, y and x (glyphs
nobody built ahead: built on a worker while the step waits). Each is timed from the cursor's
move until the view's own frame with the new glyphs is drawn (to the GPU's end where frames
are), and until the moved slice view's 2-D glyphs are built too. Tensor glyphs (instances of
source meshes) and fODF glyphs (SH surfaces, one mesh per cursor plane) alike."""

from __future__ import annotations

import cProfile
import os
import time

import numpy as np

from tests.benchmarks.render_measure import ms, profiled, rss_kb, wait, write_profile

STEPS = 6  # along z, y, x, z, y, x
JUMPS = 3  # five voxels along z, y, x
JUMP = 5
PAUSE_S = float(os.environ.get("BENCH_STEP_PAUSE_S", "0.3"))  # between steps: a reader's pace


def idle(app, seconds: float) -> None:
    """Let the event loop (and the workers) run for ``seconds``."""
    wait(app, lambda: False, seconds)


def glyph_steps(app, window, layer, clock, name: str, size_label: int, steps: int = STEPS) -> dict:
    """``steps`` one-voxel steps with ``layer``'s 3-D glyphs shown (the only glyphs shown):
    ``<name>_step_ms`` (median), ``<name>_step_parts`` (the median step's: the GUI thread's
    parts from ``clock`` and the worker's build), ``<name>_step_rss_mb`` (after each step),
    ``<name>_count`` (points of the glyph actors' inputs: instances for tensors, surface
    vertices for fODFs), ``<name>_actor`` (their mapper), ``<name>_actors`` (one; fODFs: one
    per plane), ``<name>_step_actors_changed`` (per step: the actors given another mesh) and
    ``<name>_step_with_slice_ms`` (median: until the moved slice view's 2-D glyphs are built
    as well; the ``slice_build_*`` parts are that build's), ``<name>_step_made_ahead`` (per
    step: its 3-D glyphs had been built ahead), ``<name>_jump_ms`` and ``<name>_jump_all_ms``
    (the five-voxel jumps), ``<name>_step_pause_s``."""
    from tractlens.widgets.glyphs import wait_for_builds

    view, doc = window.view3d, window.document
    app.processEvents()
    wait_for_builds(120_000)
    assert wait(app, view.glyphs_ready, 120)
    times, parts, rss, changed, slice_times, ahead = [], [], [], [], [], []
    profile = cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None
    for index in range(steps + JUMPS):
        idle(app, PAUSE_S)
        inputs = [actor.GetMapper().GetInput() for actor in view.glyphs.actors(layer)]
        hits = view.glyphs.ahead.hits
        clock.start(view)
        start = time.perf_counter()
        with profiled(f"{name}_steps", size_label, profile):
            doc.set_cursor(doc.cursor + np.eye(3, dtype=int)[2 - index % 3] * (1 if index < steps else JUMP))
            app.processEvents()
            assert wait(app, view.glyphs_ready, 120)
            # the view's own frame with them, begun after they came (it may be drawn already: the
            # delivery and its frame can fall in one processEvents call). A frame drawn here
            # besides would be drawn twice: the view's request, still pending, would draw again
            # at the start of the next step.
            came = view.glyphs.tasks[id(layer)].delivered_at
            assert wait(app, lambda t=came: not view._render_pending and view.renders[-1][0] >= t, 120)
        times.append(time.perf_counter() - start)
        ahead.append(view.glyphs.ahead.hits > hits)
        axis = 2 - index % 3
        moved = next(v for v in window.views.values() if v.geometry_now().normal_axis == axis)
        assert wait(app, moved.glyphs_ready, 120)  # the moved slice view's 2-D glyphs (after the 3-D frame)
        slice_times.append(time.perf_counter() - start)
        rss.append(round(rss_kb() / 1024))
        changed.append(sum(actor.GetMapper().GetInput() not in inputs for actor in view.glyphs.actors(layer)))
        task = view.glyphs.tasks.get(id(layer))
        part = clock.parts(view)
        part.update({f"build_{k[:-2]}_ms": round(1e3 * v, 1) for k, v in getattr(task, "timings", {}).items()})
        task2d = moved.glyphs.tasks.get(id(layer))
        part.update({f"slice_build_{k[:-2]}_ms": round(1e3 * v, 1) for k, v in getattr(task2d, "timings", {}).items()})
        parts.append(part)
    if profile is not None:
        write_profile(profile, f"{name}_steps", size_label)
    actors = view.glyphs.actors(layer)
    jumps, times, slice_times = times[steps:], times[:steps], slice_times[:steps]
    return {
        f"{name}_step_pause_s": PAUSE_S,
        f"{name}_step_made_ahead": ahead,  # steps, then jumps
        f"{name}_jump_ms": ms(jumps),
        f"{name}_jump_all_ms": [round(1e3 * t, 1) for t in jumps],
        f"{name}_step_ms": ms(times),
        f"{name}_step_all_ms": [round(1e3 * t, 1) for t in times],
        # until the moved slice view's 2-D glyphs are built too (waited for after the 3-D frame)
        f"{name}_step_with_slice_ms": ms(slice_times),
        f"{name}_step_with_slice_all_ms": [round(1e3 * t, 1) for t in slice_times],
        f"{name}_step_rss_mb": rss,
        # waiting for a worker, building on it, reaching and delivering on the GUI thread
        f"{name}_step_parts": parts[int(np.argsort(times)[len(times) // 2])],
        f"{name}_step_parts_all": parts,  # every step's and jump's, in order
        f"{name}_count": sum(int(actor.GetMapper().GetInput().GetNumberOfPoints()) for actor in actors),
        f"{name}_actor": type(actors[0].GetMapper()).__name__ if actors else None,
        f"{name}_actors": len(actors),
        f"{name}_step_actors_changed": changed,  # actors given another mesh, per step
    }


def fod_scene_layer(document, shape, affine, lmax: int = 8):
    """An fODF layer on bench_render's grid (MRtrix's default lmax 8: 45 coefficients, float32):
    one random lobe per voxel of the same ellipsoid as the tensors, nothing outside it."""
    from tractlens.app.model import Layer
    from tractlens.app.volumes import Volume
    from tractlens.gpu.sh import sh_basis

    grid = np.indices(shape, dtype=np.float32)
    inside = sum(((grid[a] - shape[a] / 2) / (0.42 * shape[a])) ** 2 for a in range(3)) <= 1.0
    del grid
    rng = np.random.default_rng(2)
    directions = rng.normal(size=(int(inside.sum()), 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    count = (lmax + 1) * (lmax + 2) // 2
    sh = np.zeros((*shape, count), np.float32)
    where = np.nonzero(inside)
    for lo in range(0, len(directions), 1 << 16):  # a lobe along each direction (the basis there), in parts
        hi = lo + (1 << 16)
        part = sh_basis(np, directions[lo:hi], lmax) * 0.2
        part[:, 0] = 0.3
        sh[where[0][lo:hi], where[1][lo:hi], where[2][lo:hi]] = part
    return document.add_layer(Layer("fODFs", Volume("fODFs", sh, affine, kind="fod"), "fod"))
