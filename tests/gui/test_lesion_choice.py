"""Issue 22, defect 5: the Presurgical panel's lesion is explicit, never a scalar map by default, and
never changed silently; the distance from the mouse to it is in the status line."""

from __future__ import annotations

import shutil

import numpy as np


def test_the_panel_never_guesses_the_lesion(demo_window, demo_dir, tmp_path, qtbot):
    win, doc = demo_window, demo_window.document
    panel = win.presurgical_panel
    tumour_file = tmp_path / "tumour.nii.gz"
    shutil.copy(demo_dir / "lesion.nii.gz", tumour_file)
    win.open_paths([tumour_file])
    assert win.wait_for_jobs(60)
    seed = win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")  # the newest layer: not a lesion
    assert panel.lesion_box.layer() is None
    assert panel.lesion_box.currentIndex() == -1
    offered = set(panel.lesion_box.layers)
    assert seed in offered and doc.layer("tumour") in offered
    assert not any(layer.kind == "scalar" for layer in offered)  # no FA, MD … by default
    assert panel.measure() is None and "Choose the lesion first" in panel.status.text()

    panel.scalar_box.setChecked(True)  # asked for explicitly: scalar maps with a threshold
    assert doc.layer("FA") in panel.lesion_box.layers and panel.lesion_box.layer() is None
    panel.scalar_box.setChecked(False)

    doc.set_roi_role(seed, "lesion")  # marked as the lesion: chosen
    assert panel.lesion_box.layer() is seed
    panel.lesion_box.choose(doc.layer("tumour"))
    assert panel.lesion_box.layer() is doc.layer("tumour")

    doc.remove_layer(doc.layer("tumour"))  # removed: the choice is cleared, and said
    assert panel.lesion_box.layer() is None
    assert "The lesion tumour was removed" in panel.status.text()
    assert panel.measure() is None
    win.open_paths([demo_dir / "lesion.nii.gz"])  # a new layer named lesion later: still not silently
    assert win.wait_for_jobs(60)
    assert panel.lesion_box.layer() is None


def test_the_lesion_choice_is_saved_in_the_session(demo_window, demo_dir, tmp_path, qtbot):
    win, doc = demo_window, demo_window.document
    panel = win.presurgical_panel
    panel.scalar_box.setChecked(True)
    panel.threshold_box.setValue(0.6)
    panel.lesion_box.choose(doc.layer("FA"))
    assert panel.lesion_threshold() == 0.6
    win.save_session(tmp_path / "case.tractlens")
    assert win.wait_for_jobs(60) and win.errors == []
    panel.scalar_box.setChecked(False)
    assert panel.lesion_box.layer() is None
    win.open_session(tmp_path / "case.tractlens")
    assert win.wait_for_jobs(60) and win.errors == []
    assert panel.lesion_box.layer() is win.document.layer("FA") and panel.lesion_threshold() == 0.6


def test_distance_from_the_mouse_to_the_lesion_in_the_status_line(demo_window, demo_dir):
    win, doc = demo_window, demo_window.document
    win.open_paths([demo_dir / "lesion.nii.gz"])
    assert win.wait_for_jobs(60)
    lesion = doc.layer("lesion")
    assert win.presurgical_panel.lesion_box.layer() is lesion
    inside = np.argwhere(np.asarray(lesion.data.data) != 0)[0]
    win.update_hover_label(inside)
    assert "in lesion" in win.hover_label.text()
    outside = inside.copy()
    outside[0] = 0 if inside[0] > doc.reference_shape[0] // 2 else doc.reference_shape[0] - 1
    win.update_hover_label(outside)
    text = win.hover_label.text()
    assert "to lesion" in text and " mm" in text.split("to lesion")[1]
