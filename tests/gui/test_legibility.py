"""Legible views (issue 22, item 6): colour bars side by side, an orientation marker in 3-D,
one colour per ROI with outlines that stay visible over colour FA, fibres with a dark halo."""

import numpy as np
import pytest

from tests.conftest import ARTIFACTS
from tests.gui.test_view_controls import grab_rgb
from tractlens.app.model import Layer, Tractogram, Volume

SHAPE = (30, 30, 20)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def coloured_tractogram(name: str, y: float, n: int = 6) -> Layer:
    x = np.linspace(4, 26, 23)
    lines = [np.stack([x, np.full_like(x, y + i), np.full_like(x, 10.0)], -1) for i in range(n)]
    tract = Tractogram.from_list(
        lines, affine=AFFINE, dimensions=SHAPE, name=name, streamline_scalars={"weight": np.arange(n, dtype=float)}
    )
    return Layer(name, tract, "tractogram")


def shown_bar_titles(view3d) -> list[str]:
    bars = view3d.plotter.scalar_bars
    return [title for title in bars.keys() if bars[title].GetVisibility()]


def test_one_labelled_colour_bar_for_the_selected_tractogram_none_for_hidden_or_empty_ones(window, qtbot):
    doc = window.document
    doc.add_layer(Layer("blank", Volume("blank", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    layers = [doc.add_layer(coloured_tractogram(f"bundle {i}", 4 + 7 * i)) for i in range(3)]
    for layer in layers:
        layer.set(color_by="weight")
    view = window.view3d
    assert len(shown_bar_titles(view)) == 1  # one bar, never four identical ones
    window.select_layer(layers[0])
    assert shown_bar_titles(view) == ["bundle 0: COMMIT weight"]  # the selected layer's, in words
    (bar,) = [view.plotter.scalar_bars["bundle 0: COMMIT weight"]]
    assert bar.GetTitleTextProperty().GetFontSize() >= 12 and bar.GetWidth() >= 0.4
    window.save_screenshot(ARTIFACTS / "colour_bar_selected.png")
    layers[0].set(visible=False)  # hidden: its bar goes, another shown layer's comes
    assert shown_bar_titles(view) and "bundle 0" not in shown_bar_titles(view)[0]
    for layer in layers[1:]:
        layer.set(visible=False)
    assert shown_bar_titles(view) == []
    layers[2].set(visible=True, color_by="direction")  # coloured by direction: no bar
    assert shown_bar_titles(view) == []


def test_the_3d_view_has_an_anatomical_orientation_marker(window, qtbot):
    from tractlens.widgets.view3d_overlays import MARKER_VIEWPORT

    cube = window.view3d.orientation_marker
    labels = {
        cube.GetXPlusFaceText(): "+x",
        cube.GetXMinusFaceText(): "-x",
        cube.GetYPlusFaceText(): "+y",
        cube.GetYMinusFaceText(): "-y",
        cube.GetZPlusFaceText(): "+z",
        cube.GetZMinusFaceText(): "-z",
    }
    assert labels == {"R": "+x", "L": "-x", "A": "+y", "P": "-y", "S": "+z", "I": "-z"}  # RAS+
    image = window.view3d.screenshot()
    height, width = image.shape[:2]
    x0, y0, x1, y1 = MARKER_VIEWPORT
    corner = image[int((1 - y1) * height) : int((1 - y0) * height), int(x0 * width) : int(x1 * width)]
    rest = image[int((1 - y0) * height) :, int(x1 * width) :]
    assert (corner.max(-1) > 60).sum() > 100  # the cube is drawn (nothing else is in an empty scene)
    assert (rest.max(-1) > 60).sum() == 0


def test_each_new_roi_gets_its_own_colour_and_a_role_change_keeps_it_apart(window, qtbot):
    doc = window.document
    doc.add_layer(Layer("blank", Volume("blank", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    seeds = [window.roi_tools.new_roi("seed") for _ in range(3)]
    target = window.roi_tools.new_roi("target")
    colours = [layer.color_rgb() for layer in (*seeds, target)]
    assert len(set(colours)) == 4  # seeds differ from each other and from the target
    assert seeds[0].color_rgb() == pytest.approx((0.1, 0.9, 0.2), abs=1 / 255)  # the first: the role's colour
    doc.set_roi_role(seeds[1], "exclusion")
    red, green, _blue = seeds[1].color_rgb()
    assert red > 0.8 and green < 0.6  # an exclusion is drawn in the exclusion family now
    assert seeds[1].color_rgb() != doc.layer("seed 1").color_rgb()


def test_roi_outlines_are_drawn_in_their_colour_with_a_dark_halo_over_colour_fa(window, qtbot):
    doc = window.document
    green = np.zeros((*SHAPE, 3), np.float32)
    green[..., 1] = 1.0  # a colour FA that is green everywhere: the worst case for a green seed
    doc.add_layer(Layer("colour FA", Volume("colour FA", green, AFFINE), "rgb"))
    doc.set_cursor([15, 15, 10])
    roi = window.roi_tools.new_roi("seed")
    doc.paint(roi, np.array([[x, y, 10] for x in range(10, 20) for y in range(10, 20)]), True)
    axial = window.views["axial"]
    axial.show_crosshair = False
    pixels = grab_rgb(axial).astype(int)
    edge = axial.widget_point_of_voxel([9.5, 15, 10])  # on the ROI's left edge
    around = pixels[int(edge.y()) - 3 : int(edge.y()) + 4, int(edge.x()) - 3 : int(edge.x()) + 4]
    assert (around.max(-1) < 60).any()  # the dark halo: the edge shows on green
    inside = axial.widget_point_of_voxel([15, 15, 10])
    outside = axial.widget_point_of_voxel([4, 4, 10])
    # The fill alone hardly differs from the map (green on green): the outline does the work.
    fill_contrast = np.abs(pixels[int(inside.y()), int(inside.x())] - pixels[int(outside.y()), int(outside.x())]).sum()
    assert fill_contrast < 120


def test_outline_segments_trace_the_mask_boundary():
    from tractlens.widgets.roi_outlines import outline_segments

    mask = np.zeros((5, 6), bool)
    mask[1:3, 2:5] = True  # a 2 x 3 block
    segments = outline_segments(mask)
    assert len(segments) == 4  # collinear edges joined: one segment per side
    lengths = np.hypot(segments[:, 2] - segments[:, 0], segments[:, 3] - segments[:, 1])
    assert sorted(lengths) == [2, 2, 3, 3]
    assert outline_segments(np.zeros((3, 3), bool)).shape == (0, 4)


@pytest.mark.parametrize("background", ["colour FA", "FA"])
def test_rois_and_fibres_stay_distinguishable_on_the_demo_maps(demo_window, qtbot, background, demo_dir):
    """Screenshots over colour FA and over grey FA (tests/_artifacts/legibility_*.png): a seed, a
    target, a waypoint and an exclusion, the demo bundles, each outlined; the fibres' halo."""
    doc = demo_window.document
    for name in ("colour FA", "FA", "MD"):
        if doc.layer(name) is not None:
            doc.layer(name).set(visible=name == background)
    rois = [
        demo_window.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", "seed"),
        demo_window.open_roi(demo_dir / "roi_crossing_lr_target.nii.gz", "target"),
        demo_window.open_roi(demo_dir / "roi_crossing_ap_seed.nii.gz", "seed"),
    ]
    assert all(layer is not None for layer in rois)
    assert len({layer.color for layer in rois}) == 3  # opened ROIs get their own colours too
    voxel = np.argwhere(rois[0].data.mask)[len(np.argwhere(rois[0].data.mask)) // 2]
    doc.set_cursor(voxel)
    demo_window.wait_for_jobs(60)
    axial = demo_window.views["axial"]
    pixels = grab_rgb(axial).astype(int)
    for layer in rois:
        if not layer.data.mask[:, :, voxel[2]].any():
            continue
        r, g, b = (int(255 * c + 0.5) for c in layer.color_rgb())
        drawn = (np.abs(pixels - [r, g, b]).sum(-1) < 40).sum()
        assert drawn > 10, layer.name  # its outline colour is on screen
    demo_window.save_screenshot(ARTIFACTS / f"legibility_{background.replace(' ', '_')}.png")
    axial.grab().save(str(ARTIFACTS / f"legibility_axial_{background.replace(' ', '_')}.png"))


def test_every_roi_role_has_a_palette_and_an_outline_style():
    from tractlens.app.layers import ROLE_COLOURS, ROLE_PALETTES
    from tractlens.app.volumes import ROI_ROLES
    from tractlens.widgets.roi_outlines import ROLE_LINES

    for role in ROI_ROLES:  # a role added without its colours broke every paint of such an ROI
        assert role in ROLE_COLOURS and role in ROLE_PALETTES and role in ROLE_LINES, role
