"""Every layer kind through its layer menu's "Save as…", then File ▸ Open again: the same data
(tractograms with their point and streamline scalars; maps on their grid)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gui.actions import choose_from_layer_menu
from tractlens.app.model import Layer, Tractogram, Volume
from tractlens.widgets import dialogs
from tractlens.widgets.panels import SAVE_AS

AFFINE = np.array([[2.0, 0, 0, -20.0], [0, 2.0, 0, -22.0], [0, 0, 2.5, -10.0], [0, 0, 0, 1]])
SHAPE = (20, 22, 8)


def _tractogram() -> Tractogram:
    rng = np.random.default_rng(3)
    lines = [np.cumsum(rng.normal(0.0, 1.5, size=(n, 3)), axis=0) + np.array([0.0, 0.0, 5.0]) for n in (5, 9, 7, 12)]
    points = sum(len(line) for line in lines)
    return Tractogram.from_list(
        lines,
        affine=AFFINE,
        dimensions=SHAPE,
        point_scalars={"fa": rng.uniform(size=(points, 1)).astype(np.float32)},
        streamline_scalars={"weight": rng.uniform(size=(len(lines), 1)).astype(np.float32)},
    )


def _save_through_the_menu(win, qtbot, layer, path) -> None:
    with dialogs.answers(save_file=[path]):
        choose_from_layer_menu(win, qtbot, layer, SAVE_AS)
    assert win.wait_for_jobs(60) and win.errors == [], win.errors
    assert path.exists()


def _reopen(win, path) -> Layer:
    before = set(map(id, win.document.layers))
    win.open_paths([path])
    assert win.wait_for_jobs(60) and win.errors == [], win.errors
    return [layer for layer in win.document.layers if id(layer) not in before]


@pytest.mark.parametrize("suffix", [".trk", ".tck", ".trx"])
def test_a_tractogram_saved_as_opens_again_equal_with_its_scalars(window, qtbot, tmp_path, suffix):
    win = window
    win.document.add_layer(Layer("FA", Volume("FA", np.full(SHAPE, 0.5, np.float32), AFFINE), "scalar"))
    tract = win.document.add_layer(Layer("computed bundle", _tractogram(), "tractogram"))
    path = tmp_path / f"bundle{suffix}"
    _save_through_the_menu(win, qtbot, tract, path)
    (again,) = _reopen(win, path)
    assert again.kind == "tractogram" and len(again.data) == len(tract.data)
    np.testing.assert_allclose(again.data.points_world(), tract.data.points_world(), atol=1e-3)  # float32 files
    np.testing.assert_array_equal(again.data.offsets, tract.data.offsets)
    for name, values in tract.data.point_scalars.items():
        np.testing.assert_allclose(np.ravel(again.data.point_scalars[name]), np.ravel(values), rtol=1e-6)
    for name, values in tract.data.streamline_scalars.items():
        np.testing.assert_allclose(np.ravel(again.data.streamline_scalars[name]), np.ravel(values), rtol=1e-6)


def test_scalar_label_rgb_tensor_and_roi_layers_saved_as_nifti_open_again_equal(window, qtbot, tmp_path):
    win, doc = window, window.document
    rng = np.random.default_rng(5)
    scalar = doc.add_layer(Layer("FA", Volume("FA", rng.uniform(size=SHAPE).astype(np.float32), AFFINE), "scalar"))
    labels_data = np.zeros(SHAPE, np.int32)
    labels_data[2:8, 3:9, 1:4], labels_data[10:15, 10:18, 3:7] = 1, 7
    labels = doc.add_layer(Layer("atlas", Volume("atlas", labels_data, AFFINE, kind="labels"), "labels"))
    rgb = doc.add_layer(
        Layer(
            "colour FA",
            Volume("colour FA", rng.uniform(size=(*SHAPE, 3)).astype(np.float32), AFFINE, kind="rgb"),
            "rgb",
        )
    )
    d = np.zeros((*SHAPE, 6), np.float32)
    d[..., 0], d[..., 3], d[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3  # xx, yy, zz: prolate along x
    d[..., 1] = rng.uniform(-1e-4, 1e-4, size=SHAPE)
    tensor = doc.add_layer(Layer("tensors", Volume("tensors", d, AFFINE, kind="tensor"), "tensor", visible=False))
    roi = win.roi_tools.new_roi("seed")
    doc.paint(roi, np.array([[x, y, 3] for x in range(4, 9) for y in range(5, 11)]), True)

    for layer, name in ((scalar, "fa.nii.gz"), (labels, "atlas.nii.gz"), (rgb, "rgb.nii"), (tensor, "dti_tensor")):
        path = tmp_path / name
        _save_through_the_menu(win, qtbot, layer, path if path.suffix else path.with_name(name + ".nii.gz"))
    (fa_again,) = _reopen(win, tmp_path / "fa.nii.gz")
    assert fa_again.kind == "scalar"
    np.testing.assert_array_equal(fa_again.data.data, scalar.data.data)
    np.testing.assert_allclose(fa_again.data.affine, AFFINE)
    (atlas_again,) = _reopen(win, tmp_path / "atlas.nii.gz")
    assert atlas_again.kind == "labels"
    np.testing.assert_array_equal(atlas_again.data.data, labels_data)
    (rgb_again,) = _reopen(win, tmp_path / "rgb.nii")
    assert rgb_again.kind == "rgb"
    np.testing.assert_allclose(rgb_again.data.data, rgb.data.data, rtol=1e-6)
    tensors_again = next(layer for layer in _reopen(win, tmp_path / "dti_tensor.nii.gz") if layer.kind == "tensor")
    np.testing.assert_allclose(tensors_again.data.data, d, rtol=1e-5, atol=1e-9)

    path = tmp_path / "seed.nii.gz"
    _save_through_the_menu(win, qtbot, roi, path)
    again = win.open_roi(path, role="seed")
    assert again is not None
    np.testing.assert_array_equal(again.data.mask, roi.data.mask)


def test_save_as_names_the_file_and_never_replaces_one_unasked(window, qtbot, tmp_path):
    from tractlens.widgets.controllers.layer_saving import save_layer_as

    win = window
    win.document.add_layer(Layer("FA", Volume("FA", np.full(SHAPE, 0.5, np.float32), AFFINE), "scalar"))
    tract = win.document.add_layer(Layer("computed bundle", _tractogram(), "tractogram"))
    existing = tmp_path / "kept.trk"
    existing.write_bytes(b"not a tractogram")
    with dialogs.answers(question=[False]):
        assert save_layer_as(win, tract, existing) is None
    assert existing.read_bytes() == b"not a tractogram"
    save_layer_as(win, tract, tmp_path / "no_suffix")  # the kind's first suffix is added
    assert win.wait_for_jobs(60) and (tmp_path / "no_suffix.trk").exists()
