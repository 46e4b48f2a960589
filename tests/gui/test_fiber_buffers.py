"""Tractograms in the 3-D view at whole-brain scale (issue 41): the points go to the GPU once as
one vertex buffer over the tractogram's own float32 array; colouring, selection and the level
of detail change lookup tables and index ranges, never the points; the level drawn is stated."""

import numpy as np
import pytest
from vtkmodules.util.numpy_support import vtk_to_numpy

from tests.benchmarks.bench_render import synthetic_trx
from tests.conftest import ARTIFACTS
from tests.gui.pieces import open_in_pieces
from tractlens.app import fiber_arrays
from tractlens.widgets import view3d_fibers


@pytest.fixture
def opened(window, qtbot, tmp_path):
    """A synthetic whole-brain-like .trx (6,000 streamlines of 40 points) opened by the window,
    with the slices hidden (nothing but the fibres in 3-D)."""
    path = synthetic_trx(tmp_path, 6000, 40)
    window.open_paths([path])
    assert window.wait_for_jobs(120) and window.errors == []
    layer = next(layer for layer in window.document.layers if layer.kind == "tractogram")
    view = window.view3d
    qtbot.waitUntil(lambda: id(layer) in view._fibers, timeout=10_000)
    view.reset_camera()
    return window, layer, view._fibers[id(layer)]["scene"]


def points_state(scene):
    data = scene.points.GetData()
    return scene.points, data, scene.points.GetMTime(), data.GetMTime()


def test_the_points_are_the_tractograms_float32_array_in_one_vertex_buffer(opened):
    _window, layer, scene = opened
    points = layer.data.mapped.world  # the file's float32 millimetres, memory-mapped (a .trx opened)
    assert not layer.data.mapped.made
    assert points.dtype == np.float32 and points.flags.c_contiguous
    drawn = vtk_to_numpy(scene.points.GetData())
    assert drawn.dtype == np.float32 and np.shares_memory(drawn, points)  # wrapped, not copied
    assert drawn.ctypes.data == points.ctypes.data
    # Every level draws from the same vtkPoints and the same colour array: one buffer on the GPU.
    rest, moving = scene.polydata["actor"], scene.polydata["moving"]
    assert rest.GetPoints() is moving.GetPoints() is scene.points
    assert rest.GetPointData().GetArray("direction") is moving.GetPointData().GetArray("direction")
    direction = vtk_to_numpy(rest.GetPointData().GetArray("direction"))
    assert direction.dtype == np.uint8 and direction.shape == (len(points), 4)
    # The actor places the points in the world (the file's millimetres: the identity); no float64
    # anywhere on the way.
    matrix = scene.actor.GetUserMatrix()
    np.testing.assert_allclose([[matrix.GetElement(i, j) for j in range(4)] for i in range(4)], np.eye(4))
    per_point = [value for value in vars(scene.arrays).values() if getattr(value, "size", 0) > 16]
    assert per_point and all(value.dtype != np.float64 for value in per_point)
    # All streamlines at rest (software OpenGL draws up to 2 M points): the implicit identity.
    lines = rest.GetLines()
    assert lines.IsStorageGeneric() and lines.GetNumberOfCells() == len(layer.data)


def test_colour_changes_do_not_touch_the_points(opened, qtbot):
    window, layer, scene = opened
    view = window.view3d
    before = points_state(scene)
    first = view.screenshot()
    layer.set(color_by="weight", colormap="viridis", clim=(0.0, 1.0))  # a per-streamline weight
    qtbot.wait(50)
    mapper = scene.actor.GetMapper()
    assert mapper.GetArrayName() == "weight" and mapper.GetScalarModeAsString() == "UseCellFieldData"
    np.testing.assert_allclose(mapper.GetScalarRange(), (0.0, 1.0))
    weighted = view.screenshot()
    assert points_state(scene) == before  # same vtkPoints, same array, nothing modified
    assert np.abs(weighted.astype(int) - first.astype(int)).sum() > 0
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_buffers_weight.png")
    layer.set(color_by="direction")
    qtbot.wait(50)
    assert points_state(scene) == before and mapper.GetArrayName() == "direction"


def test_a_selection_changes_only_the_index_ranges(opened, qtbot):
    _window, layer, scene = opened
    before = points_state(scene)
    selected = np.zeros(len(layer.data), dtype=bool)
    selected[::7] = True
    layer.set_selection(selected, by="a test")
    qtbot.wait(50)
    assert points_state(scene) == before
    lines = scene.polydata["actor"].GetLines()
    assert lines.GetNumberOfCells() == selected.sum()
    offsets = layer.data.offsets
    expected = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in np.flatnonzero(selected)])
    np.testing.assert_array_equal(vtk_to_numpy(lines.GetConnectivityArray()), expected)
    layer.set_selection(None)
    qtbot.wait(50)
    assert points_state(scene) == before
    assert scene.polydata["actor"].GetLines().GetNumberOfCells() == len(layer.data)


def test_the_level_of_detail_while_moving_is_stated_on_screen(opened, qtbot):
    window, _layer, scene = opened
    view = window.view3d
    assert view.lod_text() == ""  # at rest: everything drawn, nothing to say
    view._coarse_detail()  # what a mouse press on the view does
    text = view.lod_text()
    moving = fiber_arrays.INTERACTIVE_STREAMLINES
    assert text == f"showing {moving:,} of 6,000 streamlines while moving"
    assert scene.moving.GetVisibility() and not scene.actor.GetVisibility()
    assert scene.polydata["moving"].GetLines().GetNumberOfCells() == moving
    shot = view.screenshot()
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_buffers_moving.png")
    height, width = shot.shape[:2]
    corner = shot[: height // 12, width // 2 :].astype(int)  # the line in the top right corner
    assert ((corner[..., 0] > 150) & (corner[..., 1] > 120) & (corner[..., 2] < 120)).sum() > 30
    view._full_detail()
    assert view.lod_text() == "" and scene.actor.GetVisibility() and not scene.moving.GetVisibility()


def test_at_rest_the_view_says_when_it_draws_fewer(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (50_000, False))  # a small software budget
    path = synthetic_trx(tmp_path, 6000, 40)
    window.open_paths([path])
    assert window.wait_for_jobs(120)
    view = window.view3d
    qtbot.waitUntil(lambda: bool(view._fibers), timeout=10_000)
    view._full_detail()
    assert view.lod_text().startswith("1,250 of 6,000 streamlines drawn at rest: software OpenGL")


def test_hardware_rest_and_moving_levels_follow_the_measured_full_frame(window, qtbot, tmp_path, monkeypatch):
    """With hardware OpenGL: every streamline at rest unless a full frame is over the budget (then
    said, and the moving level drawn), every streamline while moving when a full frame is fast.
    The budgets are set to 0 or to an hour here so that no verdict depends on this machine's speed."""
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (40_000, False))  # the levels are made when opened
    view = window.view3d
    monkeypatch.setattr(view, "_software", lambda: False)
    monkeypatch.setattr(view, "_software_rendering", False, raising=False)  # as a hardware OpenGL's view says
    cache = window.document.fiber_arrays
    cache.skip_selection_levels = frozenset({"software", "moving_software"})
    window.open_paths([synthetic_trx(tmp_path, 6000, 40)])
    assert window.wait_for_jobs(120)
    qtbot.waitUntil(lambda: bool(view._fibers), timeout=10_000)
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 3600.0)
    monkeypatch.setattr(view3d_fibers, "FULL_FRAME_BUDGET_S", 3600.0)
    view._full_detail()  # the first full frame uploads: not timed
    view._full_detail()
    assert view._full_frame_s is not None and view.lod_text() == ""
    assert "full" not in cache.skip_selection_levels
    view._coarse_detail()
    assert view.lod_text() == ""  # all drawn while moving: the full frame was within budget
    view._full_detail()
    monkeypatch.setattr(view3d_fibers, "MOVING_FRAME_BUDGET_S", 0.0)
    monkeypatch.setattr(view3d_fibers, "FULL_FRAME_BUDGET_S", 0.0)
    view._full_detail()
    text = view.lod_text()
    assert text.startswith("1,000 of 6,000 streamlines drawn at rest: a full frame took"), text
    assert "full" in cache.skip_selection_levels  # no view draws a selection's full level now: not prepared
    view._coarse_detail()
    assert view.lod_text() == "showing 1,000 of 6,000 streamlines while moving"


def test_a_tractogram_over_the_buffer_limit_is_drawn_in_pieces_over_slices_of_its_points(
    window, qtbot, tmp_path, monkeypatch
):
    """VTK counts a vertex buffer's bytes in 32 bits, so a 10 M-streamline tractogram goes to the
    GPU in pieces: each a slice of the same float32 array (not a copy), uploaded as it is (no
    shift-and-scale copy), and the picture is the one of a single buffer."""
    view = window.view3d
    monkeypatch.setattr(view, "_software", lambda: False)  # every streamline at rest, as on a GPU
    path = synthetic_trx(tmp_path, 6000, 40)
    shots = {}
    for piece_points in (fiber_arrays.PIECE_POINTS, 50_000):
        monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", piece_points)
        window.open_paths([path])
        assert window.wait_for_jobs(120) and window.errors == []
        layer = next(layer for layer in window.document.layers if layer.kind == "tractogram")
        qtbot.waitUntil(lambda layer=layer: id(layer) in view._fibers, timeout=10_000)
        scene = view._fibers[id(layer)]["scene"]
        qtbot.waitUntil(lambda scene=scene: not scene.filling, timeout=10_000)  # drawn in piece by piece
        view.reset_camera()
        view._full_detail()
        shots[piece_points] = view.screenshot()
        if piece_points == 50_000:
            break
        window.document.remove_layer(layer)
        qtbot.wait(50)
    points = layer.data.mapped.world
    assert len(scene.pieces) == 5  # 240,000 points in pieces of about 50,000
    drawn = 0
    for piece in scene.pieces:
        array = vtk_to_numpy(piece.points.GetData())
        assert np.shares_memory(array, points) and array.dtype == np.float32
        for actor in piece.actors.values():
            assert actor.GetMapper().GetVBOShiftScaleMethod() == 0  # uploaded as it is
            assert actor.GetUserMatrix() is scene.actor.GetUserMatrix()
        drawn += piece.polydata["actor"].GetLines().GetNumberOfCells()
    assert drawn == len(layer.data) and view.lod_text() == ""
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_buffers_pieces.png")
    one, pieces = (shot.astype(int) for shot in shots.values())
    assert np.abs(one - pieces).max(axis=-1).mean() < 0.01  # the same picture (draw order may differ at a pixel)
    selected = np.zeros(len(layer.data), dtype=bool)
    selected[::7] = True
    layer.set_selection(selected, by="a test")
    qtbot.wait(50)
    joined = []
    for piece, (a, _b) in zip(scene.pieces, scene.arrays.bounds, strict=True):
        lines = piece.polydata["actor"].GetLines()
        if lines.GetNumberOfCells():
            joined.append(vtk_to_numpy(lines.GetConnectivityArray()) + layer.data.offsets[a])
    offsets = layer.data.offsets
    expected = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in np.flatnonzero(selected)])
    np.testing.assert_array_equal(np.concatenate(joined), expected)


def test_a_tractogram_in_pieces_is_drawn_in_piece_by_piece_and_says_so(window, qtbot, tmp_path, monkeypatch):
    """The first frame draws the first piece (its buffers only are uploaded); each later turn of
    the event loop one more, with a line saying the rest is being drawn in."""
    view = window.view3d
    monkeypatch.setattr(view, "_software", lambda: False)
    layer, scene, queued = open_in_pieces(window, qtbot, tmp_path, monkeypatch)
    assert len(scene.pieces) == 5 and scene.shown_pieces == 1 and queued == [view._reveal_next]
    first = scene.drawn_streamlines("actor")
    assert 0 < first < len(layer.data)
    assert view.lod_text() == f"{first:,} of 6,000 streamlines drawn, more coming"
    visible = [piece.actors["actor"].GetVisibility() for piece in scene.pieces]
    assert visible == [1, 0, 0, 0, 0]
    view.reset_camera()
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "fiber_buffers_first_piece.png")
    for shown in range(2, 6):
        queued.pop()()
        assert scene.shown_pieces == shown
        assert [piece.actors["actor"].GetVisibility() for piece in scene.pieces] == [1] * shown + [0] * (5 - shown)
    assert not queued and not scene.filling and view.lod_text() == ""
    assert scene.drawn_streamlines("actor") == len(layer.data)


def test_a_growing_result_that_needs_more_pieces_gets_new_actors(window, qtbot, monkeypatch):
    """A tracking result replaced by a larger one reuses its actors while the number of pieces
    stays, and gets new actors (every streamline drawn) when it grows into more pieces."""
    from tractlens.app.model import Layer, Tractogram

    view = window.view3d
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 2_000)
    rng = np.random.default_rng(0)

    def result(n):
        points = (rng.random((n * 20, 3)) * 40).astype(np.float32)
        return Layer("result", Tractogram(points, np.arange(0, n * 20 + 1, 20), np.eye(4), (40, 40, 40)), "tractogram")

    small, same, larger = result(50), result(60), result(300)  # 1, 1 and 3 pieces
    window.document.add_layer(small)
    qtbot.waitUntil(lambda: id(small) in view._fibers, timeout=10_000)
    scene = view._fibers[id(small)]["scene"]
    window.document.replace_layer(small, same)
    assert view._fibers[id(same)]["scene"] is scene and len(scene.pieces) == 1  # reused
    window.document.replace_layer(same, larger)
    grown = view._fibers[id(larger)]["scene"]
    assert grown is not scene and len(grown.pieces) == 3
    qtbot.waitUntil(lambda: not grown.filling, timeout=10_000)
    assert sum(piece.polydata["actor"].GetLines().GetNumberOfCells() for piece in grown.pieces) == 300
    assert not any(actor in view.plotter.renderer.actors.values() for actor in scene.all_actors())


@pytest.mark.parametrize("window_device", ["cpu", pytest.param("auto", marks=pytest.mark.gpu)])  # auto: the default
def test_the_windows_roi_selection_runs_on_the_gpu_when_there_is_one(window, window_device, qtbot, tmp_path):
    """An ROI drawn over a whole-brain-like tractogram: the window's selection job uses the
    streamline index on the GPU (CuPy) and selects exactly what the NumPy engine selects; the
    view draws the selected streamlines' index ranges."""
    from tractlens.app.model import Layer, RoiMask
    from tractlens.app.selection import RoiSelection, select_fibres, streamline_index

    window.open_paths([synthetic_trx(tmp_path, 6000, 40)])
    assert window.wait_for_jobs(120) and window.errors == []
    doc = window.document
    tracts = next(layer for layer in doc.layers if layer.kind == "tractogram")
    tracts.set(filter_by_rois=True)
    shape = tracts.data.dimensions
    ijk = np.indices(shape, dtype=np.float32)
    centre = np.array(shape) / 2
    mask = sum((ijk[a] - centre[a]) ** 2 for a in range(3)) <= 8.0**2
    doc.add_layer(Layer("sphere", RoiMask("sphere", mask, tracts.data.affine, role="target"), "roi"))
    qtbot.waitUntil(lambda: tracts.selection is not None, timeout=60_000)
    assert window.wait_for_jobs(60)
    index = streamline_index(doc, tracts, tracts.data.affine, window_device)
    assert index.backend.is_gpu == (window_device == "auto")  # the default device: the GPU (gpu marker)
    request = RoiSelection.of(doc)
    [(_, on_cpu)] = select_fibres(doc, request, device="cpu")
    np.testing.assert_array_equal(tracts.selection, on_cpu)  # exact: a point is in a voxel or not
    assert 0 < on_cpu.sum() < len(on_cpu)
    qtbot.wait(50)
    scene = window.view3d._fibers[id(tracts)]["scene"]
    assert scene.polydata["actor"].GetLines().GetNumberOfCells() == on_cpu.sum()
