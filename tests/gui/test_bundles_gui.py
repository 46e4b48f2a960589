"""Track ▸ Named bundles… as a user does it (issue 39): the phantom's FA open, the dialog filled
(bundles ticked, the tensor folder, the MNI registration folder, where to write), Track bundles, the
job in the Jobs panel, the bundles as layers in their colours, and the Presurgical panel's table
with a row per bundle ("CST_L") once a lesion is chosen."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS
from tests.gui.actions import trigger
from tractlens.app.bundles import bundle_colour, protocol_of
from tractlens.app.bundles.phantom import (
    course_curve,
    make_phantom,
    phantom_grid,
    write_identity_registration,
    write_tensor,
)
from tractlens.app.layers import SOLID, hex_colour

NAMES = ("CST_L", "CST_R", "FMA")


@pytest.fixture
def phantom_folder(tmp_path):
    phantom = make_phantom(NAMES, phantom_grid(2.5))
    write_tensor(phantom, tmp_path / "dti")
    write_identity_registration(phantom.grid, tmp_path / "reg")
    fa = np.where(phantom.f[..., 0] > 0, 0.7, 0.1) * phantom.brain
    nib.save(nib.Nifti1Image(fa.astype(np.float32), phantom.affine), tmp_path / "FA.nii.gz")
    lesion = np.zeros(phantom.grid.shape, np.uint8)
    curve, _ = course_curve(protocol_of("CST_L").course)
    centre = curve[len(curve) // 2] + [-8.0, 0.0, 0.0]  # beside the left CST, 8 mm lateral
    ijk = np.rint(phantom.grid.to_voxels(centre[None])[0]).astype(int)
    lesion[tuple(slice(i - 1, i + 2) for i in ijk)] = 1
    nib.save(nib.Nifti1Image(lesion, phantom.affine), tmp_path / "lesion.nii.gz")
    return tmp_path


def test_named_bundles_from_the_track_menu_become_coloured_layers(window, qtbot, phantom_folder):
    folder = phantom_folder
    window.open_paths([folder / "FA.nii.gz"])
    assert window.wait_for_jobs(60) and window.errors == []
    assert window.first_steps.hint.isVisible()  # no tract yet: the newcomer's hint is up
    trigger(window, "Track", "Named bundles…")
    dialog = window.bundles.dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    assert dialog.checklist.count() >= 20
    dialog.source_box.setCurrentIndex(2)  # tensor
    qtbot.keyClicks(dialog.source_field.line, str(folder / "dti"))
    qtbot.keyClicks(dialog.registration_field.line, str(folder / "reg"))
    qtbot.keyClicks(dialog.output_field.line, str(folder / "bundles"))
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "Choose a bundle" in dialog.message.text()  # nothing ticked yet
    for name in NAMES:
        dialog.item(name).setCheckState(Qt.CheckState.Checked)
    dialog.form.editors["seeds_per_voxel"].setValue(2)
    jobs_before = set(window.runner.jobs)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    (job_id,) = set(window.runner.jobs) - jobs_before
    assert window.wait_for_jobs(240) and window.errors == []
    assert window.runner.jobs[job_id].state == "done"
    for name in NAMES:
        layer = window.document.layer(name)
        assert layer.kind == "tractogram" and len(layer.data) > 0
        assert layer.color_by == SOLID and layer.color == hex_colour(bundle_colour(name))
        assert layer.provenance["citation"].startswith("Warrington")
    assert (folder / "bundles" / "bundles.json").is_file()
    assert not window.first_steps.hint.isVisible()  # a first result exists: "New ROI → paint → Track" goes
    assert "3 of 3 tracked" in window.statusBar().currentMessage()
    qtbot.wait(1500)
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "bundles_layers.png")  # each bundle in its colour
    # Opaque cursor planes hid most of each bundle in 3-D: they turned translucent, which the
    # View menu shows, and the user can hide them.
    planes = [actor for _grid, actor in window.view3d._planes.values()]
    assert window.view3d.plane_mode == "translucent" and "translucent" in window.statusBar().currentMessage()
    assert planes and all(a.GetVisibility() and a.GetProperty().GetOpacity() < 1 for a in planes)
    assert window.view_controls.plane_actions["translucent"].isChecked()
    trigger(window, "View ▸ Slice planes in 3-D", "Hidden")
    assert not any(a.GetVisibility() for a in planes)
    qtbot.wait(300)
    window.save_screenshot(ARTIFACTS / "bundles_planes_hidden.png")
    trigger(window, "View ▸ Slice planes in 3-D", "Opaque")
    assert all(a.GetVisibility() and a.GetProperty().GetOpacity() == 1 for a in planes)

    lesion = window.open_roi(folder / "lesion.nii.gz", role="lesion")
    panel = window.presurgical_panel
    window.show_dock("dock_presurgical")
    panel.lesion_box.choose(lesion)
    assert panel.measure() is not None
    assert window.wait_for_jobs(60) and window.errors == []
    rows = {panel.table.item(r, 0).text(): r for r in range(panel.table.rowCount())}
    assert {"CST_L", "CST_R", "FMA"} <= set(rows)
    closest = {name: float(panel.table.item(row, 2).text().split()[0]) for name, row in rows.items() if name in NAMES}
    assert closest["CST_L"] < closest["CST_R"] and closest["CST_L"] < 12.0  # the lesion lies beside the left CST
    from tractlens.widgets.report import distance_rows

    report_rows = {row.name: row for row in distance_rows(window.document, 5.0)}  # the report's distance table
    assert {"CST_L", "CST_R", "FMA"} <= set(report_rows)
    assert report_rows["CST_L"].min_mm == pytest.approx(closest["CST_L"], abs=0.01)
    window.select_layer(window.document.layer("CST_L"))
    qtbot.wait(200)
    window.save_screenshot(ARTIFACTS / "bundles_presurgical.png")


def test_the_dialog_starts_from_the_open_samples(window, demo_bedpostx, qtbot):
    """With bedpostX samples open (a dyads layer), the dialog offers their folder."""
    window.open_paths([demo_bedpostx])
    assert window.wait_for_jobs(60) and window.errors == []
    (dyads,) = [layer for layer in window.document.layers if layer.kind == "dyads"]
    dialog = window.bundles.open_dialog()
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    assert dialog.source_box.currentIndex() == 0  # bedpostX samples
    assert dialog.source_field.text() == str(dyads.data.samples.path) != ""
