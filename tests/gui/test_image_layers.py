"""Scalar images, label maps and overlays in the main window: what an image opens as, where it
goes in the stack, label colours from the lookup table, and the values in the status bar."""

import shutil

import nibabel as nib
import numpy as np
from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS
from tests.gui.actions import choose_from_layer_menu
from tractlens.app.loaders import is_anatomical, load_layers
from tractlens.widgets.main_window import _format_value

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])
SHAPE = (48, 48, 30)


def t1_like(dtype, seed: int = 0) -> np.ndarray:
    """A skull-stripped T1: an ellipsoid of smooth grey-white contrast plus noise, zero outside."""
    rng = np.random.default_rng(seed)
    x, y, z = np.mgrid[: SHAPE[0], : SHAPE[1], : SHAPE[2]].astype(float)
    brain = ((x - 24) / 21) ** 2 + ((y - 24) / 22) ** 2 + ((z - 15) / 13) ** 2 < 1
    image = np.where(brain, 600 + 250 * np.sin(x / 5) * np.cos(y / 7) + rng.normal(0, 25, SHAPE), 0)
    if dtype == np.uint8:
        image = image / image.max() * 255  # 8-bit scanners' (and FreeSurfer's) range
    return np.clip(image, 0, None).astype(dtype)


def save(tmp_path, name: str, data: np.ndarray):
    path = tmp_path / name
    nib.save(nib.Nifti1Image(data, AFFINE), path)
    return path


def test_integer_anatomy_opens_as_scalar_and_parcellations_as_labels(tmp_path, demo_dir):
    for dtype, name in ((np.int16, "T1.nii.gz"), (np.uint8, "brain.nii.gz"), (np.uint16, "sub-01_acq.nii.gz")):
        (layer,) = load_layers(save(tmp_path, name, t1_like(dtype)))
        assert layer.kind == "scalar", (name, dtype)
        assert is_anatomical(layer)  # stored as integers: it goes under the maps
    (fa,) = load_layers(save(tmp_path, "FA.nii.gz", np.full(SHAPE, 0.4, np.float32)))
    assert fa.kind == "scalar" and not is_anatomical(fa)
    (parcellation,) = load_layers(demo_dir / "parcellation.nii.gz")  # a lookup table beside it
    assert parcellation.kind == "labels" and parcellation.data.lut.name(3) == "crossing_ap_start"
    (labels,) = load_layers(demo_dir / "labels.nii.gz")  # by name
    assert labels.kind == "labels"
    # The same parcellation under a neutral name and without its table: labels by content
    # (regions of one value), while the T1 stored as uint8 has as few values but noisy neighbours.
    shutil.copy(demo_dir / "parcellation.nii.gz", tmp_path / "regions.nii.gz")
    (regions,) = load_layers(tmp_path / "regions.nii.gz")
    assert regions.kind == "labels" and regions.data.lut is None
    (lesion,) = load_layers(demo_dir / "lesion.nii.gz")  # a mask: one colour, transparent outside
    assert lesion.kind == "labels"


def test_show_as_labels_and_back_from_the_layer_menu(window, qtbot, tmp_path, demo_dir):
    shutil.copy(demo_dir / "parcellation.nii.gz", tmp_path / "sub-01_T1w.nii.gz")  # a misleading name
    window.open_paths([tmp_path / "sub-01_T1w.nii.gz"])
    assert window.wait_for_jobs(60)
    doc = window.document
    layer = doc.layers[0]
    assert layer.kind == "labels"  # the content says labels (regions), whatever the name
    choose_from_layer_menu(window, qtbot, layer, "Show as scalar")
    assert window.wait_for_jobs(30) and window.errors == []
    scalar = doc.layers[0]
    assert scalar.kind == "scalar" and scalar.name == layer.name and len(doc.layers) == 1
    np.testing.assert_array_equal(scalar.data.data, layer.data.data)
    assert window.layer_panel.selected_layer() is scalar
    image = window.views["axial"].image_array()
    assert (image[..., 0] == image[..., 1]).all()  # grey levels now
    choose_from_layer_menu(window, qtbot, scalar, "Show as labels")
    assert window.wait_for_jobs(30) and window.errors == []
    assert doc.layers[0].kind == "labels"
    # A map of fractions cannot be labels: the user is told, the layer stays.
    fa = save(tmp_path, "FA.nii.gz", np.linspace(0, 1, np.prod(SHAPE), dtype=np.float32).reshape(SHAPE))
    window.open_paths([fa])
    assert window.wait_for_jobs(30)
    fa_layer = doc.layer("FA")
    choose_from_layer_menu(window, qtbot, fa_layer, "Show as labels")
    assert window.wait_for_jobs(30)
    assert any("not whole numbers" in e for e in window.errors) and doc.layer("FA") is fa_layer


def test_anatomy_goes_under_the_maps_and_an_overlay_is_transparent_below_a_threshold(window, qtbot, tmp_path):
    doc = window.document
    t1 = t1_like(np.int16)
    fa_values = np.zeros(SHAPE, np.float32)
    fa_values[10:38, 20:28, :] = 0.8  # a "tract" of high FA; low (0.1) around it in the brain
    fa_values[(t1 > 0) & (fa_values == 0)] = 0.1
    window.open_paths([save(tmp_path, "FA.nii.gz", fa_values)])
    assert window.wait_for_jobs(30)
    window.open_paths([save(tmp_path, "T1.nii.gz", t1)])  # opened later, yet under the map
    assert window.wait_for_jobs(30) and window.errors == []
    assert [layer.name for layer in doc.layers] == ["T1", "FA"]
    fa = doc.layer("FA")
    panel = window.layer_panel
    panel.list.setCurrentItem(panel.item_for(fa))
    panel.colormap.setCurrentText("hot")
    panel.vmax.setValue(1.5)  # FA 0.8: orange (255, 153, 0); FA 0.1: dark red
    axial = window.views["axial"]
    geometry = axial.geometry_now()
    z = int(doc.cursor[2])
    tract = geometry.pixel_of(np.array([20.0, 24.0, z]))
    around = geometry.pixel_of(np.array([30.0, 12.0, z]))  # in the brain, FA 0.1
    tract, around = tuple(round(float(v)) for v in tract), tuple(round(float(v)) for v in around)
    image = axial.image_array()
    assert image[around][0] > image[around][2]  # the opaque FA map hides the T1: hot colours
    assert not panel.threshold.isEnabled()
    qtbot.mouseClick(panel.transparent, Qt.MouseButton.LeftButton)
    assert panel.transparent.isChecked() and panel.threshold.isEnabled()
    panel.threshold.setValue(0.3)
    assert fa.transparent_below == 0.3
    image = axial.image_array()
    t1_layer = doc.layer("T1")
    lo, hi = t1_layer.clim
    grey = np.clip((t1[30, 12, z] - lo) / (hi - lo), 0, 1) * 255
    assert image[around][0] == image[around][1] == image[around][2]  # the T1 shows through, in grey
    assert abs(int(image[around][0]) - grey) <= 2
    assert image[tract][0] > 200 and image[tract][2] < 100  # the tract: FA 0.8 in hot colours, on top
    window.save_screenshot(ARTIFACTS / "t1_under_fa_overlay.png")
    qtbot.mouseClick(panel.transparent, Qt.MouseButton.LeftButton)
    assert fa.transparent_below is None


def test_files_opened_together_stack_in_the_order_given(window, tmp_path):
    doc = window.document
    big = save(tmp_path, "T1.nii.gz", t1_like(np.int16))
    small = save(tmp_path, "FA.nii.gz", np.full(SHAPE, 0.5, np.float32))
    window.open_paths([big, small])
    assert window.wait_for_jobs(30) and window.errors == []
    assert [layer.name for layer in doc.layers] == ["T1", "FA"]  # first at the bottom
    for layer in list(doc.layers):
        doc.remove_layer(layer)
    window.open_paths([small, tmp_path / "missing.nii.gz", big])  # a failure keeps the order of the rest
    assert window.wait_for_jobs(30)
    assert [layer.name for layer in doc.layers] == ["FA", "T1"]


def test_labels_take_their_lookup_table_colours_and_names(window, qtbot, demo_dir):
    window.open_paths([demo_dir / "parcellation.nii.gz"])
    assert window.wait_for_jobs(30) and window.errors == []
    doc = window.document
    parcellation = doc.layer("parcellation")
    voxel = np.argwhere(parcellation.data.data == 3)[0]  # crossing_ap_start, 60 200 60 in the table
    doc.set_cursor(voxel)
    axial = window.views["axial"]
    row, col = axial.geometry_now().cursor_pixel
    np.testing.assert_array_equal(axial.image_array()[row, col], [60, 200, 60])
    assert "parcellation 3 (crossing_ap_start)" in window.position_label.text()
    point = axial.widget_point_of_voxel(voxel)
    qtbot.mouseMove(axial, pos=point.toPoint())
    # 10 s: on a loaded machine the hover's update can take over 2 s; the verdict is the label
    qtbot.waitUntil(lambda: "crossing_ap_start" in window.hover_label.text(), timeout=10000)
    # The 3-D view's axial plane is coloured by the same table (what it shows is then shaded).
    plane_rgb = np.asarray(window.view3d._planes["axial"][0].point_data["rgb"])
    assert (plane_rgb == [60, 200, 60]).all(-1).sum() == (axial.image_array() == [60, 200, 60]).all(-1).sum() > 0
    window.save_screenshot(ARTIFACTS / "parcellation_lut.png")


def test_status_bar_shows_fa_and_lambda1_of_a_visible_tensor_layer(demo_window):
    doc = demo_window.document
    tensors = doc.layer("tensors")
    assert "tensors" not in demo_window.position_label.text()  # hidden: not listed
    tensors.set(visible=True)
    text = demo_window.position_label.text()
    matrix = np.array(tensors.data.data[tuple(doc.cursor)], dtype=np.float64)
    m = np.array(
        [[matrix[0], matrix[1], matrix[2]], [matrix[1], matrix[3], matrix[4]], [matrix[2], matrix[4], matrix[5]]]
    )
    lam = np.maximum(np.linalg.eigvalsh(m), 0)
    fa = np.sqrt(0.5 * ((lam[0] - lam[1]) ** 2 + (lam[1] - lam[2]) ** 2 + (lam[2] - lam[0]) ** 2) / (lam**2).sum())
    assert f"tensors FA {fa:.4g} λ1 {_format_value(lam[2])}" in text, text
    # and it agrees with the FA map the fit wrote (same tensor, same formula)
    assert abs(fa - doc.layer("FA").data.data[tuple(doc.cursor)]) < 1e-3
