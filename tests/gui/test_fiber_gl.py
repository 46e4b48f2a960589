"""Tractograms drawn from the 3-D view's own OpenGL buffers (issue 41): the points go to the GPU
once, from the tractogram's float32 array; a selection or level changes (first, count) ranges;
colouring is a shader change; pieces come in one by one; when the buffers cannot be used, VTK
draws the tractogram and the status bar says why. Real window, Mesa's OpenGL under Xvfb."""

import itertools

import numpy as np
import pytest

from tests.benchmarks.bench_render import AFFINE, GRID_SHAPE, synthetic_trx
from tests.conftest import ARTIFACTS
from tests.gui.pieces import open_in_pieces
from tractlens.app import fiber_arrays
from tractlens.widgets import gl_fibers, gl_fibre_program, view3d_fibers
from tractlens.widgets.fiber_actors import FiberActors
from tractlens.widgets.gl_fiber_actors import GLFiberActors


@pytest.fixture
def own_buffers(monkeypatch):
    """Every tractogram drawn from the view's own buffers (not only whole-brain sized ones)."""
    monkeypatch.setattr(view3d_fibers, "GL_LAYER_MIN_POINTS", 1)
    monkeypatch.delenv("TRACTLENS_FIBRES_GL", raising=False)


def open_fibres(window, qtbot, tmp_path, n=6000, path=None):
    path = synthetic_trx(tmp_path, n, 40) if path is None else path
    window.view3d._render_now()  # the first frame decides how tractograms are drawn
    window.open_paths([path])
    assert window.wait_for_jobs(120) and window.errors == []
    layer = next(layer for layer in window.document.layers if layer.kind == "tractogram")
    view = window.view3d
    qtbot.waitUntil(lambda: id(layer) in view._fibers, timeout=10_000)
    for other in window.document.layers:  # the fibres alone in 3-D
        if other is not layer:
            other.set(visible=False)
    view.reset_camera()
    view._full_detail()
    return layer, view._fibers[id(layer)]["scene"]


def gl_is_software() -> bool:
    """Is this machine's OpenGL software (Mesa llvmpipe under Xvfb)? Read from glxinfo when it
    is there; assumed so otherwise (CI)."""
    import shutil
    import subprocess

    if shutil.which("glxinfo") is None:
        return True
    info = subprocess.run(["glxinfo", "-B"], capture_output=True, text=True, check=False).stdout
    return "NVIDIA" not in info


def lit(shot) -> int:
    return int((shot.max(axis=-1) > 40).sum())


def read_buffer(view, buffer: int, nbytes: int, dtype) -> np.ndarray:
    """A GPU buffer's contents, read back in the view's context."""
    GL = gl_fibers.load_gl()
    view.plotter.ren_win.MakeCurrent()
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buffer)
    raw = GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, nbytes)
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
    return np.frombuffer(bytes(raw), dtype=dtype)


def test_the_points_go_to_the_gpu_once_as_they_are_and_are_drawn(own_buffers, window, qtbot, tmp_path, monkeypatch):
    released = []  # whether each uploaded chunk's pages of the file left the resident memory
    release = gl_fibers.release_pages
    monkeypatch.setattr(gl_fibers, "release_pages", lambda chunk: released.append(release(chunk)) or released[-1])
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    assert isinstance(scene, GLFiberActors) and scene.failed is None
    # the file's memory-mapped float32 millimetres, no voxel copy made (app.fiber_arrays.display_points)
    assert scene.arrays.points is layer.data.mapped.world and not layer.data.mapped.made
    [buffers] = scene.gl.buffers  # one piece, uploaded
    assert released == [True]  # in one chunk, read from the map and released from it
    # bounded by the grid's box in millimetres (the points' frame), not by its voxel corners
    box = scene.arrays.box
    np.testing.assert_allclose(scene.anchor.GetBounds(), np.ravel([box.min(0), box.max(0)], order="F"), atol=1e-4)
    on_gpu = read_buffer(view, buffers.position, scene.arrays.points.nbytes, np.float32)
    np.testing.assert_array_equal(on_gpu.reshape(-1, 3), scene.arrays.points)
    # Drawn: the streamlines in direction colours, the level-of-detail line empty (all drawn).
    shot = view.screenshot()
    assert lit(shot) > 2000 and view.lod_text() == ""
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_gl_direction.png")
    # Mesa's GL 4.5 reads the points as a texture buffer too: thin lines without a geometry
    # shader; the geometry shader's picture (older GL, or pieces over the texture limit) is the same.
    kind, why = scene.gl.program_choice()
    print(f"fibre program: {kind}: {why}")  # (-s shows it: which GL, which limits)
    assert kind == "pulled", why
    assert scene.gl.choice == (kind, why)  # what the last frame drew with (and logged)
    monkeypatch.setattr(gl_fibers, "FORCE_GEOMETRY_SHADER", True)
    view.plotter.render()
    assert scene.gl.program_kind() == "lines"
    through_geometry_shader = view.screenshot()
    assert np.abs(through_geometry_shader.astype(int) - shot.astype(int)).max(axis=-1).mean() < 0.01
    first, count = scene.gl.ranges[0]
    np.testing.assert_array_equal(first, layer.data.offsets[:-1])
    np.testing.assert_array_equal(count, np.diff(layer.data.offsets))


def test_a_selection_changes_only_the_ranges_drawn(own_buffers, window, qtbot, tmp_path):
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    position = scene.gl.buffers[0].position
    everything = lit(view.screenshot())
    selected = np.zeros(len(layer.data), dtype=bool)
    selected[::7] = True
    layer.set_selection(selected, by="a test")
    qtbot.wait(50)
    first, count = scene.gl.ranges[0]
    ids = np.flatnonzero(selected)
    np.testing.assert_array_equal(first, layer.data.offsets[ids])
    np.testing.assert_array_equal(count, np.diff(layer.data.offsets)[ids])
    assert scene.gl.buffers[0].position == position  # the same points buffer
    assert scene.cells["actor"].stored is None  # no connectivity made for the selection
    fewer = lit(view.screenshot())
    window.save_screenshot(ARTIFACTS / "fiber_gl_selection.png")
    assert 0 < fewer < everything * 0.9  # a seventh of the streamlines (dense: they overlap)
    layer.set_selection(None)
    qtbot.wait(50)
    assert len(scene.gl.ranges[0][0]) == len(layer.data)


def test_colour_modes_are_shader_changes(own_buffers, window, qtbot, tmp_path):
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    direction = view.screenshot()
    layer.set(color_by="weight", colormap="viridis", clim=(0.0, 1.0))  # a per-streamline weight
    qtbot.wait(50)
    weighted = view.screenshot()
    window.save_screenshot(ARTIFACTS / "fiber_gl_weight.png")
    assert scene.gl.colour_mode == 1 and scene.gl.clim == (0.0, 1.0)
    buffers = scene.gl.buffers[0]
    weight = layer.data.streamline_scalars["weight"]
    # Mesa's and NVIDIA's GL have gl_DrawID: one value per streamline on the GPU, none per point.
    assert scene.gl.program.draw_ids and scene.gl.per_streamline(), scene.gl.program.capabilities.words()
    assert buffers.scalar is None
    values = read_buffer(view, buffers.texture_buffers["values"][0], 4 * len(layer.data), np.float32)
    np.testing.assert_allclose(values, weight, rtol=1e-6)
    mapper = scene.actor.GetMapper()  # the colour bar's lookup table and range
    np.testing.assert_allclose(mapper.GetScalarRange(), (0.0, 1.0))
    assert any("weight" in title for title in view.plotter.scalar_bars.keys())
    assert np.abs(weighted.astype(int) - direction.astype(int)).sum() > 0
    # viridis: no pixel of the weighted picture is saturated red, as direction colours are.
    red = (weighted[..., 0] > 200) & (weighted[..., 1] < 60) & (weighted[..., 2] < 60)
    assert red.sum() < 0.01 * lit(weighted)
    layer.set(color_by="direction")
    qtbot.wait(50)
    assert scene.gl.colour_mode == 0
    np.testing.assert_array_equal(view.screenshot(), direction)  # the same frame as before
    layer.set(tubes=True)
    qtbot.wait(50)
    tubes = view.screenshot()
    window.save_screenshot(ARTIFACTS / "fiber_gl_tubes.png")
    assert scene.gl.ribbon and lit(tubes) > lit(direction)  # ribbons cover more pixels


def test_a_per_streamline_scalar_read_by_draw_draws_what_one_per_point_draws(
    own_buffers, window, qtbot, tmp_path, monkeypatch
):
    """A per-streamline weight read in the shader by gl_DrawID (through the drawn streamlines'
    ids for a selection, one draw per streamline for the decimated moving level) makes the
    picture that the same weight written per point makes."""
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    layer.set(color_by="weight", colormap="viridis", clim=(0.0, 1.0))
    selected = np.zeros(len(layer.data), dtype=bool)
    selected[::3] = True
    layer.set_selection(selected, by="a test")
    qtbot.wait(50)
    shots = {}
    for moving in (False, True):
        view._coarse_detail() if moving else view._full_detail()
        shots[moving] = view.screenshot()
        assert scene.gl.per_streamline() and scene.gl.buffers[0].scalar is None
        assert scene.gl.buffers[0].ids_given  # a selection: the drawn streamlines' ids are given
    # Software OpenGL's moving level keeps every k-th point (one draw per streamline of its
    # element buffer); hardware OpenGL's is whole streamlines (ranges).
    assert (scene.gl.decimated is not None) == gl_is_software()
    monkeypatch.setattr(gl_fibers, "FORCE_POINT_SCALARS", True)
    for moving in (False, True):
        view._coarse_detail() if moving else view._full_detail()
        per_point = view.screenshot()
        assert not scene.gl.per_streamline() and scene.gl.buffers[0].scalar is not None
        assert lit(per_point) > 1000
        np.testing.assert_array_equal(per_point, shots[moving])
    view._full_detail()


def test_the_hardware_moving_level_is_ranges_of_whole_streamlines(own_buffers, window, qtbot, tmp_path, monkeypatch):
    """With hardware OpenGL the moving level is a subset of whole streamlines: other ranges over
    the same buffer, said on screen (budgets set so that no verdict depends on this machine)."""
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (40_000, False))
    view = window.view3d
    view._software()  # reads this OpenGL (own buffers allowed), then says it is hardware
    monkeypatch.setattr(view, "_software", lambda: False)
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 0.0)
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view._coarse_detail()
    assert view.lod_text() == "showing 1,000 of 6,000 streamlines while moving"
    first, count = scene.gl.ranges[0]
    ids = scene.cells["moving"].streamlines
    assert len(first) == 1000 and scene.gl.decimated is None
    np.testing.assert_array_equal(first, layer.data.offsets[ids])
    np.testing.assert_array_equal(count, np.diff(layer.data.offsets)[ids])
    assert lit(view.screenshot()) > 1000
    view._full_detail()
    assert len(scene.gl.ranges[0][0]) == 6000


def test_the_moving_level_thins_to_the_gpus_measured_rate_and_says_so(
    own_buffers, window, qtbot, tmp_path, monkeypatch
):
    """A GPU that draws few lines a second (as a compute card's graphics) draws every k-th
    streamline of the moving level, k from the rate its timed full frame showed, so that a moving
    frame keeps its budget; the line on screen gives the count drawn, and a per-streamline weight
    read by gl_DrawID follows the thinned draws (the same picture as the weight written per point).
    The rate is set here, so that no verdict depends on this machine's speed."""
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (40_000, False))  # 1,000 streamlines of 40 points
    view = window.view3d
    view._software()
    monkeypatch.setattr(view, "_software", lambda: False)
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 0.001)
    monkeypatch.setattr(view3d_fibers, "FULL_FRAME_BUDGET_S", 3600.0)
    layer, scene = open_fibres(window, qtbot, tmp_path)
    view._full_detail()  # a full frame timed (the first one uploaded the points)
    assert view._points_per_s is not None and view._points_per_s > 0
    view._full_frame_s, view._points_per_s = 1.0, 10_000_000.0  # 10,000 points in a 1 ms moving frame
    for entry in view._fibers.values():
        view._place_cells(entry)
    assert scene.moving_stride == 4
    view._coarse_detail()
    assert view.lod_text() == "showing 250 of 6,000 streamlines while moving"
    ids = scene.cells["moving"].streamlines[::4]
    first, count = scene.gl.ranges[0]
    np.testing.assert_array_equal(first, layer.data.offsets[ids])
    np.testing.assert_array_equal(count, np.diff(layer.data.offsets)[ids])
    assert lit(view.screenshot()) > 300
    layer.set(color_by="weight", colormap="viridis", clim=(0.0, 1.0))
    qtbot.wait(50)
    view._coarse_detail()
    by_draw = view.screenshot()
    assert scene.gl.per_streamline() and scene.gl.buffers[0].ids_given
    monkeypatch.setattr(gl_fibers, "FORCE_POINT_SCALARS", True)
    view._coarse_detail()
    view.plotter.render()
    np.testing.assert_array_equal(view.screenshot(), by_draw)
    view._full_detail()
    assert view.lod_text() == "" and len(scene.gl.ranges[0][0]) == 6000


def test_where_a_full_frame_is_slow_every_streamline_is_drawn_simplified(
    own_buffers, window, qtbot, tmp_path, monkeypatch
):
    """A full frame over the moving budget makes the view ask a worker for the tractogram
    simplified within 0.1 mm: drawn at rest instead of the whole (every streamline, nothing said
    on screen, the picture within a pixel's rounding of the whole), while moving too once its own
    frame is within the budget; zoomed in past half a pixel, or with a selection, the whole again.
    Budgets and frame times are set here, so that no verdict depends on this machine's speed."""
    view = window.view3d
    view._software()
    monkeypatch.setattr(view, "_software", lambda: False)
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 1e-9)  # every full frame is slow
    monkeypatch.setattr(view3d_fibers, "FULL_FRAME_BUDGET_S", 3600.0)
    layer, scene = open_fibres(window, qtbot, tmp_path)
    whole = view.screenshot()
    view._full_detail()  # timed: over the moving budget, so the simplified level is asked for
    qtbot.waitUntil(view.simplified_ready, timeout=60_000)
    simple = view._simplifier.cells[id(layer)]
    assert simple.decimated and simple.n_streamlines == 6000 and simple.n_points < layer.data.offsets[-1] // 2
    assert scene.cells["actor"] is simple and view.lod_text() == ""
    assert view._simplifier.frame_s is not None  # its own frame was timed on arrival
    drawn = view.screenshot()
    window.save_screenshot(ARTIFACTS / "fiber_gl_simplified.png")
    assert abs(lit(drawn) - lit(whole)) <= 0.02 * lit(whole), (lit(drawn), lit(whole))
    moved = ((drawn.max(axis=-1) > 40) != (whole.max(axis=-1) > 40)).sum()
    assert moved <= 0.05 * lit(whole), moved  # a few pixels of line edges, not a different picture
    view._coarse_detail()
    assert scene.moving_drawn() and view.lod_text().startswith("showing ")  # its frame is over the budget
    # The whole slow, the simplified fast: a rest times the simplified frame, not the whole's.
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 3600.0)
    view._full_frame_s = 7200.0
    view._full_detail()
    assert view._full_frame_s == 7200.0 and view._simplifier.frame_s < 3600.0
    assert scene.cells["actor"] is simple
    view._coarse_detail()
    assert scene.cells["moving"] is simple and view.lod_text() == ""  # every streamline while moving
    view._set_moving(False)
    view.plotter.camera.zoom(40.0)  # 0.1 mm is now more than half a pixel
    for entry in view._fibers.values():
        view._place_cells(entry)
    assert scene.cells["actor"] is not simple and scene.cells["actor"].identity
    view.plotter.camera.zoom(1 / 40.0)
    selected = np.zeros(len(layer.data), dtype=bool)
    selected[::4] = True
    layer.set_selection(selected, by="a test")
    qtbot.wait(50)
    for entry in view._fibers.values():
        view._place_cells(entry)
    assert scene.cells["actor"] is not simple and scene.cells["actor"].n_streamlines == 1500
    layer.set_selection(None)
    qtbot.wait(50)
    view._simplifier.made_for[id(layer)] = object()  # as if the tractogram's arrays had been replaced
    for entry in view._fibers.values():
        view._place_cells(entry)
    assert scene.cells["actor"] is not simple and id(layer) not in view._simplifier.cells  # dropped, not drawn


@pytest.mark.skipif("not gl_is_software()", reason="software OpenGL's moving level (every k-th point)")
def test_the_moving_level_is_drawn_and_stated(own_buffers, window, qtbot, tmp_path):
    """With software OpenGL the moving level keeps every k-th point of some streamlines: drawn
    from an element buffer over the same points, and said on screen."""
    _layer, scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    assert view._software()
    view._coarse_detail()
    moving = fiber_arrays.INTERACTIVE_STREAMLINES
    assert view.lod_text() == f"showing {moving:,} of 6,000 streamlines while moving"
    shot = view.screenshot()
    window.save_screenshot(ARTIFACTS / "fiber_gl_moving.png")
    assert scene.gl.decimated is not None and scene.gl.buffers[0].n_elements > 0
    assert lit(shot) > 1000
    height, width = shot.shape[:2]
    corner = shot[: height // 12, width // 2 :].astype(int)  # the line in the top right corner, over the fibres
    assert ((corner[..., 0] > 150) & (corner[..., 1] > 120) & (corner[..., 2] < 120)).sum() > 30
    view._full_detail()
    assert view.lod_text() == "" and scene.gl.decimated is None


def test_a_float16_file_is_drawn_from_its_map_as_its_values_in_float32(own_buffers, window, qtbot, tmp_path):
    """A .trx of float16 positions is drawn from its memory map (no float32 copy in the window):
    the GPU holds its values as float32, and the picture is that of a float32 file of the same
    values."""
    from tractlens.app.io.tractogram_stream import open_tractogram_writer
    from tractlens.app.model import Tractogram

    assert window.document.fiber_arrays.shader_drawn_min_points is None  # no frame has decided it yet
    layer, scene = open_fibres(window, qtbot, tmp_path, path=synthetic_trx(tmp_path, 6000, 40, dtype="float16"))
    view, mapped = window.view3d, layer.data.mapped
    # decided before the loading job (as for a file given to ``tractlens view``): float16 kept
    assert window.document.fiber_arrays.shader_drawn_min_points == 1
    assert mapped.world.dtype == np.float16 and scene.arrays.points is mapped.world and not mapped.made
    assert np.shares_memory(scene.pieces[0], mapped.world)
    [buffers] = scene.gl.buffers
    values = np.asarray(mapped.world, dtype=np.float32)
    on_gpu = read_buffer(view, buffers.position, values.nbytes, np.float32)
    np.testing.assert_array_equal(on_gpu.reshape(-1, 3), values)
    half = view.screenshot()
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_gl_float16.png")
    assert lit(half) > 2000 and view.lod_text() == ""
    offsets = layer.data.offsets
    window.document.remove_layer(layer)
    qtbot.wait(50)
    as_float32 = tmp_path / "as_float32.trx"
    with open_tractogram_writer(as_float32, AFFINE, GRID_SHAPE, points_in_mm=True) as writer:
        writer.append(Tractogram(values, offsets, AFFINE, GRID_SHAPE))
    layer, scene = open_fibres(window, qtbot, tmp_path, path=as_float32)
    assert scene.arrays.points.dtype == np.float32
    assert np.abs(view.screenshot().astype(int) - half.astype(int)).max(axis=-1).mean() < 0.01


def test_pieces_come_in_one_by_one_and_make_the_same_picture(own_buffers, window, qtbot, tmp_path, monkeypatch):
    view = window.view3d
    layer, scene = open_fibres(window, qtbot, tmp_path)
    whole = view.screenshot()
    window.document.remove_layer(layer)
    qtbot.wait(50)
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 50_000)
    layer, scene = open_fibres(window, qtbot, tmp_path)
    assert isinstance(scene, GLFiberActors) and len(scene.pieces) == 5
    qtbot.waitUntil(lambda: not scene.filling, timeout=10_000)
    view._full_detail()
    assert len(scene.gl.buffers) == 5 and view.lod_text() == ""
    for piece, buffers in zip(scene.pieces, scene.gl.buffers, strict=True):
        assert np.shares_memory(piece, layer.data.mapped.world) and buffers.n_points == len(piece)
    assert sum(len(first) for first, _count in scene.gl.ranges) == len(layer.data)
    pieces = view.screenshot()
    window.save_screenshot(ARTIFACTS / "fiber_gl_pieces.png")
    assert np.abs(whole.astype(int) - pieces.astype(int)).max(axis=-1).mean() < 0.01


def test_when_the_shaders_fail_vtk_draws_and_the_status_bar_says_why(own_buffers, window, qtbot, tmp_path, monkeypatch):
    def refuse(*_args):
        raise gl_fibers.GLUnavailable("a fibre shader does not compile here: (a test)")

    monkeypatch.setattr(gl_fibre_program, "_compile", refuse)
    layer, _scene = open_fibres(window, qtbot, tmp_path)
    view = window.view3d
    qtbot.waitUntil(lambda: isinstance(view._fibers[id(layer)]["scene"], FiberActors), timeout=10_000)
    message = window.statusBar().currentMessage()
    assert message.startswith("Fibres drawn by VTK") and "(a test)" in message
    view.reset_camera()
    view._full_detail()
    assert lit(view.screenshot()) > 2000  # drawn all the same
    window.save_screenshot(ARTIFACTS / "fiber_gl_fallback.png")


def test_the_environment_can_keep_tractograms_on_vtk(own_buffers, window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_FIBRES_GL", "0")
    window.view3d._software_rendering = None  # read again at the next frame (the window's first was before)
    layer, scene = open_fibres(window, qtbot, tmp_path)
    assert isinstance(scene, FiberActors)
    assert "TRACTLENS_FIBRES_GL=0" in window.statusBar().currentMessage()
    assert layer.data.mapped.world is scene.arrays.points


def test_the_first_frame_draws_the_first_piece_alone_and_each_later_one_piece_more(
    own_buffers, window, qtbot, tmp_path, monkeypatch
):
    """Whatever turns of the event loop come first, no frame uploads two new pieces: the first
    frame with fibres shows the first piece alone (on an H200, 10 M streamlines drew two pieces,
    3.2 GB, before anything was seen), said on screen, and each later frame one piece more."""
    view = window.view3d
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 50_000)
    frames = []  # (pieces on the GPU, the level-of-detail line) at the end of each frame with fibres

    def ended(*_args):
        for entry in view._fibers.values():
            if entry["scene"].uploaded_pieces:
                frames.append((entry["scene"].uploaded_pieces, view.lod_text()))

    view.plotter.ren_win.AddObserver("EndEvent", ended, -1.0)
    _layer, scene = open_fibres(window, qtbot, tmp_path)
    qtbot.waitUntil(lambda: not scene.filling, timeout=10_000)
    view.plotter.render()
    counts = [count for count, _text in frames]
    assert counts[0] == 1 and counts[-1] == 5
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(counts)), counts
    a, b = scene.arrays.bounds[0]
    first = b - a
    assert frames[0][1] == f"{first:,} of 6,000 streamlines drawn, more coming"


def test_a_tractogram_hidden_while_its_pieces_come_still_gets_them_all(
    own_buffers, window, qtbot, tmp_path, monkeypatch
):
    """A hidden layer draws nothing, so its pieces never reach the GPU while hidden: the pieces
    are still revealed (a turn each), and drawn once it is shown again."""
    view = window.view3d
    view._render_now()  # the first frame decides how tractograms are drawn
    layer, scene, queued = open_in_pieces(window, qtbot, tmp_path, monkeypatch)
    layer.set(visible=False)
    turns = 0
    while queued and turns < 20:
        queued.pop(0)()
        turns += 1
    assert not scene.filling and scene.uploaded_pieces < 5 and turns <= 10
    layer.set(visible=True)
    view.plotter.render()
    assert scene.uploaded_pieces == 5
