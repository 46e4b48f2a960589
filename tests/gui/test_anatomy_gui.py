"""Anatomy in the window, as a user does it: a 1 mm T1 opened beside the 2 mm diffusion data,
Image ▸ Register to DWI… (a job with progress and Cancel), the T1 shown registered, its
alignment judged by blend/checkerboard/edges, a lesion drawn on the T1 at its resolution and
measured against the tracts, atlas regions and the MNI coordinate through a template
registration, and sessions and reports that keep the registrations.

The images are small and synthetic (tests/anatomy_window_synth.py: a 24³ b0 and a 40³ T1 whose head
lies a known shift away), so a rigid registration takes a couple of seconds on the CPU."""

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.anatomy_window_synth import SHIFT_MM, t1_affine, write_pair
from tests.conftest import ARTIFACTS
from tests.gui.actions import press_drag_release, trigger
from tractlens.app.grid import Grid
from tractlens.app.integrity import document_problems
from tractlens.app.model import Tractogram
from tractlens.widgets import dialogs

pytest.importorskip("dipy")  # the anatomy extra: the test extra installs it


def open_pair(window, tmp_path: Path):
    b0, t1 = write_pair(tmp_path / "data")
    window.open_paths([b0, t1])
    assert window.wait_for_jobs(60)
    doc = window.document
    return doc.layer("dwi_b0"), doc.layer("T1w")


def register_rigid(window, qtbot, t1_layer) -> int:
    """Select the T1, Image ▸ Register to DWI…, rigid, Register; the job id."""
    window.select_layer(t1_layer)
    trigger(window, "Image", "Register to DWI…")
    dialog = window.anatomy.register_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    assert dialog.moving_box.currentText() == "T1w" and dialog.fixed_box.currentText() == "dwi_b0"
    dialog.form.editors["type"].setCurrentText("rigid")
    jobs_before = set(window.runner.jobs)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    (job_id,) = set(window.runner.jobs) - jobs_before
    return job_id


@pytest.fixture
def registered(window, qtbot, tmp_path):
    _b0, t1 = open_pair(window, tmp_path)
    register_rigid(window, qtbot, t1)
    assert window.wait_for_jobs(120), "the registration did not finish"
    assert window.errors == []
    return window, window.document.layer("dwi_b0"), window.document.layer("T1w")


def test_a_1mm_t1_opens_beside_the_dwi_and_is_shown_registered(window, qtbot, tmp_path):
    b0, t1 = open_pair(window, tmp_path)
    assert Grid.of(t1.data).voxel_sizes.tolist() == [1.0, 1.0, 1.0] and not Grid.of(t1.data).matches(Grid.of(b0.data))
    assert window.anatomy.alignment.placed.text() == "scanner coordinates"  # nothing registered it yet
    messages = []
    window.runner.job_changed.connect(lambda job_id: messages.append(window.runner.jobs[job_id].message))
    register_rigid(window, qtbot, t1)
    assert window.wait_for_jobs(120)
    assert window.errors == []
    assert any("registering T1w" in text for text in messages)  # the job said what it was doing
    placed = window.document.layer("T1w")
    assert placed is not t1 and placed.kind == "scalar"
    (registration_id,) = window.document.registrations
    registration = window.document.registrations[registration_id]
    # The T1's own voxels, moved by the shift found: its head now lies where the b0's does, within
    # a millimetre (half a DWI voxel) on average over the head.
    expected = t1_affine()
    expected[:3, 3] -= SHIFT_MM
    head = np.argwhere(np.asarray(t1.data.data) > 500)
    error = np.linalg.norm(
        Grid(placed.data.affine, t1.data.shape3).to_mm(head) - Grid(expected, (1, 1, 1)).to_mm(head), axis=1
    )
    assert error.mean() < 1.0, error.mean()
    assert placed.data.data is t1.data.data  # not resampled: its own 1 mm voxels
    record = placed.provenance["registration"]
    assert record["id"] == registration_id and record["kind"] == "rigid"
    window.select_layer(placed)
    assert window.anatomy.alignment.placed.text() == registration.describe()
    assert "T1w" in registration.describe() and "dwi_b0" in registration.describe()
    window.save_screenshot(ARTIFACTS / "anatomy_registered.png")


def test_cancelling_a_registration_changes_nothing(window, qtbot, tmp_path):
    _b0, t1 = open_pair(window, tmp_path)
    job_id = register_rigid(window, qtbot, t1)
    trigger(window, "Jobs", "Cancel all jobs")
    assert window.wait_for_jobs(60)
    assert window.runner.jobs[job_id].state == "cancelled"
    assert window.document.layer("T1w") is t1 and "registration" not in t1.provenance
    assert window.document.registrations == {}
    assert window.errors == []
    assert document_problems(window.document) == []


def test_alignment_is_judged_by_blend_checkerboard_and_edges(registered, qtbot):
    window, _b0, t1 = registered
    axial = window.views["axial"]
    window.select_layer(t1)
    controls = window.anatomy.alignment
    plain_image = axial.image_array().copy()
    window.layer_panel.parentWidget().parentWidget().ensureWidgetVisible(controls)  # scrolled into view
    controls.mode.setCurrentText("checkerboard")
    controls.size.setValue(8.0)
    assert t1.alignment == "checkerboard" and t1.checker_mm == 8.0
    checker = axial.image_array().copy()
    t1.set(visible=False)
    b0_only = axial.image_array().copy()  # at the b0's resolution: one pixel a 2 mm voxel
    t1.set(visible=True)
    assert checker.shape[0] == 2 * b0_only.shape[0]  # the T1 shows at its 1 mm: two pixels a b0 voxel
    b0_only = np.repeat(np.repeat(b0_only, 2, axis=0), 2, axis=1)
    # every pixel shows either the T1 or the b0 under it, and both appear
    from_t1 = np.all(checker == plain_image, axis=-1)
    from_b0 = np.all(checker == b0_only, axis=-1)
    assert np.all(from_t1 | from_b0)
    differ = ~np.all(plain_image == b0_only, axis=-1)
    assert (from_t1 & differ).sum() > 50 and (from_b0 & differ).sum() > 50
    window.save_screenshot(ARTIFACTS / "anatomy_checkerboard.png")
    controls.mode.setCurrentText("edges")
    edges = axial.image_array()
    magenta = (edges[..., 0] > 200) & (edges[..., 2] > 180) & (edges[..., 1] < 80)
    assert magenta.sum() > 20  # the head's outline and the ventricles
    untouched = ~magenta
    np.testing.assert_array_equal(edges[untouched], b0_only[untouched])  # elsewhere: the b0 itself
    window.save_screenshot(ARTIFACTS / "anatomy_edges.png")
    controls.mode.setCurrentText("blend")
    blend = axial.image_array().astype(int)
    mixed = np.abs(blend - (plain_image.astype(int) + b0_only.astype(int)) / 2)
    assert mixed[differ].max() <= 1.0
    controls.mode.setCurrentText("none")
    np.testing.assert_array_equal(axial.image_array(), plain_image)


def fibres_near(tmp_path: Path, doc) -> Path:
    """Straight streamlines along y at increasing distances (in x) from the lesion, saved as .trk."""
    from tractlens.app.io.tractogram import save_tractogram

    lines = [np.column_stack([np.full(20, x), np.linspace(2, 21, 20), np.full(20, 12.0)]) for x in (17, 18, 19.5, 21)]
    points = np.concatenate(lines).astype(np.float32)
    offsets = np.arange(0, 20 * (len(lines) + 1), 20, dtype=np.int64)
    tract = Tractogram(points, offsets, doc.reference_affine, doc.reference_shape, name="near")
    return save_tractogram(tract, tmp_path / "near.trk")


def measure(window, qtbot, lesion) -> np.ndarray:
    panel = window.presurgical_panel
    panel.lesion_box.choose(lesion)
    qtbot.mouseClick(panel.measure_button, Qt.MouseButton.LeftButton)
    assert window.wait_for_jobs(60)
    assert window.errors == []
    return np.array(panel.distances["near"].per_streamline, dtype=float)


def test_a_lesion_drawn_on_the_t1_measures_as_the_same_lesion_drawn_on_the_dwi_grid(registered, qtbot, tmp_path):
    window, b0, t1 = registered
    doc = window.document
    axial = window.views["axial"]
    z = 12
    doc.set_cursor((12, 12, z))
    window.role_box.setCurrentText("lesion")
    window.radius_box.setValue(2)
    stroke = [(10, 10, z), (12, 12, z), (14, 12, z)]
    # On the T1: ROI ▸ New ROI on the selected image, at its 1 mm resolution.
    window.select_layer(t1)
    trigger(window, "ROI", "New ROI on the selected image")
    on_t1 = window.roi_tools.active_roi()
    assert Grid.of(on_t1.data).matches(Grid.of(t1.data)) and window.roi_tools.tool == "brush"
    press_drag_release(qtbot, axial, stroke)
    assert on_t1.data.mask.sum() > 0
    painted_t1 = np.argwhere(on_t1.data.mask)
    on_reference = Grid.of(b0.data).to_voxels(Grid.of(t1.data).to_mm(painted_t1))
    assert set(np.rint(on_reference[:, 2]).astype(int)) == {z}  # in the slice painted on
    assert len(set(painted_t1[:, 2])) == 2  # both 1 mm slices of the 2 mm one
    window.save_screenshot(ARTIFACTS / "anatomy_lesion_on_t1.png")
    # Saved in the T1's own space (for the planning software that holds the T1): the same voxels,
    # where the scanner put the T1: the lesion lies the head's shift away from its place on the DWI.
    import nibabel as nib

    with dialogs.answers(save_file=[str(tmp_path / "lesion_t1.nii.gz")]):
        trigger(window, "ROI", "Save ROI in its image's scanner space…")
    saved = nib.load(tmp_path / "lesion_t1.nii.gz")
    np.testing.assert_allclose(saved.affine, t1_affine(), atol=1e-5)
    assert (np.asarray(saved.dataobj) > 0).sum() == on_t1.data.mask.sum()
    in_t1_space = Grid(saved.affine, saved.shape).to_mm(np.argwhere(np.asarray(saved.dataobj) > 0)).mean(0)
    in_dwi_space = Grid.of(on_t1.data).to_mm(painted_t1).mean(0)
    np.testing.assert_allclose(in_t1_space - in_dwi_space, SHIFT_MM, atol=0.5)
    # The same strokes on the DWI grid.
    window.select_layer(b0)
    window.new_roi()
    on_dwi = window.roi_tools.active_roi()
    assert Grid.of(on_dwi.data).matches(Grid.of(b0.data))
    press_drag_release(qtbot, axial, stroke)
    # Brought to the DWI grid (nearest neighbour), the T1 lesion is the DWI one within a voxel's edge.
    moved = doc.roi_on_reference(on_t1)
    overlap = 2 * (moved & on_dwi.data.mask).sum() / (moved.sum() + on_dwi.data.mask.sum())
    assert overlap > 0.75, overlap
    window.open_paths([fibres_near(tmp_path, doc)])
    assert window.wait_for_jobs(60)
    from_t1 = measure(window, qtbot, on_t1)
    from_dwi = measure(window, qtbot, on_dwi)
    assert np.all(np.isfinite(from_t1)) and len(from_t1) == 4
    np.testing.assert_allclose(from_t1, from_dwi, atol=2.0)  # one DWI voxel (2 mm)
    assert np.all(np.diff(from_t1) > 0)  # farther streamlines, larger distances
    assert document_problems(doc) == []


def template_folder(tmp_path: Path, window, shift=(4.0, -3.0, 2.0)) -> Path:
    """A `tractlens register DWI mni` folder whose answer is a translation (subject + shift = MNI)."""
    from tractlens.app.atlases import load_template
    from tractlens.app.io.transforms import save_registration
    from tractlens.app.registration import Registration

    data, affine = load_template("mni")
    doc = window.document
    to_subject = np.eye(4)
    to_subject[:3, 3] = -np.asarray(shift)  # fixed (MNI) points -> moving (subject) points
    registration = Registration(
        Grid(affine, data.shape),
        Grid(doc.reference_affine, doc.reference_shape),
        to_subject,
        kind="affine",
        fixed_name="mni",
        moving_name="dwi_b0.nii.gz",
        template="mni",
        template_side="fixed",
    )
    return save_registration(registration, tmp_path / "to_mni", {"made_by": "test"})


def test_mni_coordinate_and_atlas_regions_through_a_template_registration(window, qtbot, tmp_path):
    open_pair(window, tmp_path)
    doc = window.document
    assert window.anatomy.mni_label.text() == ""
    trigger(window, "ROI", "Add atlas region…")  # refused, with the way to get one
    assert window.errors and "MNI template" in window.errors[-1]
    window.errors.clear()
    folder = template_folder(tmp_path, window)
    with dialogs.answers(folder=[str(folder)]):
        trigger(window, "File", "Open registration…")
    assert window.wait_for_jobs(60)
    assert window.errors == []
    doc.set_cursor((10, 14, 12))
    x, y, z = doc.cursor_world() + np.array([4.0, -3.0, 2.0])
    assert window.anatomy.mni_label.text() == f"MNI ({x:.1f}, {y:.1f}, {z:.1f}) mm"
    assert window.anatomy.mni_label.isVisible()
    trigger(window, "ROI", "Add atlas region…")
    dialog = window.anatomy.atlas_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    dialog.atlas_box.setCurrentIndex(dialog.atlas_box.findData("harvard-oxford-subcortical"))
    qtbot.keyClicks(dialog.search, "thalamus")
    dialog.side_box.setCurrentIndex(dialog.side_box.findData("left"))
    assert [dialog.regions.item(i).text() for i in range(dialog.regions.count())] == ["Left_Thalamus"]
    window.save_screenshot(ARTIFACTS / "anatomy_atlas_dialog.png")
    dialog.grab().save(str(ARTIFACTS / "anatomy_atlas_dialog_only.png"))
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert window.wait_for_jobs(60)
    assert window.errors == []
    roi = doc.layer("Left_Thalamus")
    assert roi.kind == "roi" and Grid.of(roi.data).matches(Grid(doc.reference_affine, doc.reference_shape))
    mask = roi.data.mask
    assert mask.sum() > 50
    # the left thalamus lies left of the midline and near the MNI origin (here: shifted by the registration)
    centre = Grid(doc.reference_affine, doc.reference_shape).to_mm(np.argwhere(mask)).mean(0) + np.array([4, -3, 2])
    assert -20 < centre[0] < -3 and -30 < centre[1] < 0 and -5 < centre[2] < 20, centre
    window.select_layer(roi)
    window.save_screenshot(ARTIFACTS / "anatomy_atlas_region.png")


def test_sessions_keep_registrations_and_the_report_names_them(registered, qtbot, tmp_path):
    from tractlens.widgets.report import provenance_lines

    window, _b0, t1 = registered
    ((registration_id, registration),) = window.document.registrations.items()
    lines = provenance_lines(t1)
    assert lines[0] == (f"placed by registration {registration_id}", registration.describe())  # (setting, value)
    assert not any("scanner affine" in " ".join(line) for line in lines)
    path = tmp_path / "anatomy.tractlens"
    window.save_session(path)
    assert window.wait_for_jobs(60)
    window.document.registrations.clear()
    window.open_session(path)
    assert window.wait_for_jobs(60)
    assert window.errors == []
    reopened = window.document.registrations[registration_id]
    np.testing.assert_allclose(reopened.affine, registration.affine, atol=1e-6)
    assert reopened.fixed.matches(registration.fixed) and reopened.moving.matches(registration.moving)
    assert reopened.describe() == registration.describe()
    layer = window.document.layer("T1w")
    assert layer.provenance["registration"]["id"] == registration_id
    np.testing.assert_allclose(layer.data.affine, t1.data.affine, atol=1e-9)


def test_the_register_dialogs_offer_what_can_be_registered_and_refuse_an_image_onto_itself(window, qtbot, tmp_path):
    b0_path, _t1_path = write_pair(tmp_path / "data")
    trigger(window, "Image", "Register to DWI…")  # nothing open: told what to do, no dialog
    assert window.errors and "Open the diffusion data" in window.errors[-1]
    window.errors.clear()
    window.open_paths([b0_path])
    assert window.wait_for_jobs(60)
    trigger(window, "Image", "Register DWI to MNI…")
    dialog = window.anatomy.register_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    assert dialog.moving_box.currentText() == "dwi_b0"
    assert dialog.fixed_box.currentText() == "MNI152 template" and not dialog.fixed_box.isEnabled()
    assert dialog.form.editors["type"].currentText() == "affine"  # RegisterParams' default
    dialog.reject()
    trigger(window, "Image", "Register to DWI…")
    dialog = window.anatomy.register_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    jobs = set(window.runner.jobs)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)  # the b0 onto itself
    assert dialog.isVisible() and "two different images" in dialog.message.text()
    dialog.form.editors["affine_iterations"].setText("100 fifty")
    dialog.moving_box.setCurrentIndex(0)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "whole numbers" in dialog.message.text()
    assert set(window.runner.jobs) == jobs and window.document.registrations == {}
    dialog.grab().save(str(ARTIFACTS / "anatomy_register_dialog.png"))


def test_a_registration_folder_opened_places_the_image_it_moves(window, qtbot, tmp_path):
    from tractlens.app.anatomy import register_images
    from tractlens.app.params import RegisterParams

    b0, t1 = open_pair(window, tmp_path)
    folder = tmp_path / "t1_to_b0"
    made = register_images(t1.data.source, b0.data.source, folder, RegisterParams(type="rigid"))  # tractlens register
    with dialogs.answers(folder=[str(folder)]):
        trigger(window, "File", "Open registration…")
    assert window.wait_for_jobs(60)
    assert window.errors == []
    placed = window.document.layer("T1w")
    assert placed is not t1 and placed.data.data is t1.data.data
    np.testing.assert_allclose(
        placed.data.affine, np.linalg.solve(made.registration.affine, t1.data.affine), atol=1e-5
    )  # the folder's transform, as written and read back
    (registration,) = window.document.registrations.values()
    assert registration.folder == str(folder) and str(folder) in placed.provenance["registration"]["describe"]
    assert window.anatomy.mni_label.text() == ""  # not a template registration


def test_an_fmri_map_of_the_t1_space_is_placed_with_the_t1_registration(registered, qtbot, tmp_path):
    import nibabel as nib

    window, b0, _t1 = registered
    # a 3 mm activation map in the T1's scanner space: a blob on the bright nucleus, at (8, -9, -5) + the shift
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    affine[:3, 3] = -19.5
    points = np.stack(np.meshgrid(*[np.arange(14)] * 3, indexing="ij"), -1) * 3.0 - 19.5
    nucleus_in_t1_space = np.array([8.0, -9.0, -5.0]) + SHIFT_MM
    zstat = 5 * np.exp(-((points - nucleus_in_t1_space) ** 2).sum(-1) / 18)
    nib.save(nib.Nifti1Image(zstat.astype(np.float32), affine), tmp_path / "zstat1.nii.gz")
    window.open_paths([tmp_path / "zstat1.nii.gz"])
    assert window.wait_for_jobs(60)
    fmri = window.document.layer("zstat1")
    window.select_layer(fmri)
    (registration_id,) = window.document.registrations
    with dialogs.answers(choice=[registration_id]):
        trigger(window, "Image", "Apply a registration to the selected image…")
    assert window.wait_for_jobs(60)
    assert window.errors == []
    placed = window.document.layer("zstat1")
    assert placed is not fmri and placed.provenance["registration"]["id"] == registration_id
    peak = np.unravel_index(np.argmax(placed.data.data), placed.data.shape3)
    np.testing.assert_allclose(Grid.of(placed.data).to_mm([peak])[0], [8, -9, -5], atol=1.5)  # on the nucleus
    placed.set(colormap="hot", transparent_below=1.0)
    window.document.set_cursor(Grid.of(b0.data).to_voxels([[8.0, -9.0, -5.0]])[0])  # the slices through the nucleus
    window.save_screenshot(ARTIFACTS / "anatomy_fmri_placed.png")


def test_a_lesion_drawn_before_the_registration_moves_with_its_image(window, qtbot, tmp_path):
    _b0, t1 = open_pair(window, tmp_path)
    doc = window.document
    window.role_box.setCurrentText("lesion")
    window.select_layer(t1)
    trigger(window, "ROI", "New ROI on the selected image")  # on the T1 as the scanner placed it
    lesion = window.roi_tools.active_roi()
    press_drag_release(qtbot, window.views["axial"], [(10, 10, 12), (13, 11, 12)])
    drawn = lesion.data.mask.copy()
    assert drawn.any()
    register_rigid(window, qtbot, t1)
    assert window.wait_for_jobs(120)
    assert window.errors == []
    placed, moved = doc.layer("T1w"), doc.layer(lesion.name)
    assert moved is not lesion and moved.data.role == "lesion"
    np.testing.assert_array_equal(moved.data.mask, drawn)  # the same T1 voxels...
    np.testing.assert_allclose(moved.data.affine, placed.data.affine)  # ...where the T1 now is
    assert moved.provenance["registration"] == placed.provenance["registration"]
    assert document_problems(doc) == []


def test_the_register_dialog_takes_brain_masks_from_open_layers_or_files(window, qtbot, tmp_path, monkeypatch):
    from scipy import ndimage

    from tractlens.app import anatomy as use_cases

    b0, t1 = open_pair(window, tmp_path)
    brain = ndimage.binary_fill_holes(np.asarray(b0.data.data) > 100)
    window.open_roi(_write_mask(tmp_path / "b0_brain.nii.gz", brain, b0.data.affine), role="seed")
    t1_brain = ndimage.binary_fill_holes(np.asarray(t1.data.data) > 100)
    t1_mask_path = _write_mask(tmp_path / "t1_brain.nii.gz", t1_brain, t1.data.affine)
    assert window.wait_for_jobs(60)
    seen = {}
    real = use_cases.register_images

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    monkeypatch.setattr(use_cases, "register_images", spy)
    window.select_layer(t1)
    trigger(window, "Image", "Register to DWI…")
    dialog = window.anatomy.register_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    moving_box, fixed_box = dialog.moving_mask_box, dialog.fixed_mask_box
    assert moving_box.currentText() == fixed_box.currentText() == "none"
    offered = [fixed_box.itemText(i) for i in range(fixed_box.count())]
    assert "b0_brain" in offered and offered[-1] == "a file…"
    fixed_box.setCurrentIndex(offered.index("b0_brain"))
    with dialogs.answers(open_file=[str(t1_mask_path)]):  # "a file…": the file dialog, answered
        moving_box.activated.emit(moving_box.count() - 1)
    assert moving_box.currentText() == "t1_brain.nii.gz"
    dialog.form.editors["type"].setCurrentText("rigid")
    dialog.grab().save(str(ARTIFACTS / "anatomy_register_dialog_masks.png"))
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert window.wait_for_jobs(120) and window.errors == [], window.errors
    assert seen["moving_mask"] == str(t1_mask_path)
    fixed_mask = seen["fixed_mask"]  # the ROI layer's mask, a copy on its grid
    np.testing.assert_array_equal(fixed_mask.mask, brain)
    assert fixed_mask.name == "b0_brain" and fixed_mask is not window.document.layer("b0_brain").data.mask
    message = window.statusBar().currentMessage()
    assert "within the brain masks t1_brain.nii.gz and b0_brain" in message, message
    assert window.document.layer("T1w") is not t1  # shown registered

    # a file dialog closed without a choice leaves no mask
    trigger(window, "Image", "Register to DWI…")
    dialog = window.anatomy.register_dialog
    with dialogs.answers(open_file=[None]):
        dialog.moving_mask_box.activated.emit(dialog.moving_mask_box.count() - 1)
    assert dialog.moving_mask_box.currentText() == "none"
    dialog.reject()


def _write_mask(path: Path, mask: np.ndarray, affine: np.ndarray) -> Path:
    import nibabel as nib

    nib.save(nib.Nifti1Image(mask.astype(np.uint8), affine), path)
    return path


def test_the_3d_view_draws_a_1mm_t1_at_its_own_resolution_over_the_2mm_dwi(window, qtbot, tmp_path):
    b0, t1 = open_pair(window, tmp_path)
    view3d, doc = window.view3d, window.document
    b0.set(visible=False)  # the T1 alone on the planes
    qtbot.waitUntil(lambda: "axial" in view3d._planes, timeout=5000)
    grid, _actor = view3d._planes["axial"]
    nx, ny, _nz = doc.reference_shape  # the 2 mm b0 grid
    assert tuple(grid.dimensions)[:2] in ((2 * nx, 2 * ny), (2 * ny, 2 * nx))  # two points per 2 mm voxel
    points = np.asarray(grid.points).reshape(grid.dimensions[1], grid.dimensions[0], 3)
    spacing = np.linalg.norm(points[0, 1] - points[0, 0])
    assert spacing == pytest.approx(1.0)  # the T1's voxel size, not the b0's 2 mm
    # two neighbouring points inside one 2 mm voxel show two T1 voxels: colours differ somewhere
    rgb = np.asarray(grid.point_data["rgb"]).reshape(grid.dimensions[1], grid.dimensions[0], 3).astype(int)
    assert (np.abs(rgb[:, 0::2] - rgb[:, 1::2]).sum(-1) > 0).mean() > 0.05
    # the T1 hidden: back to the DWI's resolution, one actor per plane
    t1.set(visible=False)
    b0.set(visible=True)
    qtbot.waitUntil(lambda: tuple(view3d._planes["axial"][0].dimensions)[:2] in ((nx, ny), (ny, nx)), timeout=5000)
    assert len(view3d._planes) == 3
    window.save_screenshot(ARTIFACTS / "anatomy_3d_planes_at_the_t1_resolution.png")


def test_a_t1_registered_to_mni_and_to_the_dwi_gives_the_mni_coordinate_and_atlas_regions(registered, qtbot, tmp_path):
    """T1 → MNI (a folder of 'tractlens register T1 mni') and T1 → DWI (registered in the window)
    are chained through the T1: the MNI coordinate of the cursor and the atlas regions work."""
    from tractlens.app.atlases import load_template
    from tractlens.app.io.transforms import save_registration
    from tractlens.app.registration import ChainedRegistration, Registration

    window, _b0, t1 = registered
    doc = window.document
    ((_key, t1_to_dwi),) = doc.registrations.items()
    data, affine = load_template("mni")
    to_t1 = np.eye(4)
    to_t1[:3, 3] = (-4.0, 3.0, -2.0)  # MNI point -> T1 point: T1 + (4, -3, 2) = MNI
    t1_scan = t1.data.unplaced if getattr(t1.data, "unplaced", None) is not None else t1.data
    t1_to_mni = Registration(Grid(affine, data.shape), Grid(t1_scan.affine, t1_scan.data.shape[:3]), to_t1,
                             kind="affine", fixed_name="mni", moving_name="T1w", template="mni",
                             template_side="fixed")  # fmt: skip
    folder = save_registration(t1_to_mni, tmp_path / "t1_to_mni", {"made_by": "test"})
    with dialogs.answers(folder=[str(folder)]):
        trigger(window, "File", "Open registration…")
    assert window.wait_for_jobs(60) and window.errors == [], window.errors
    template = window.anatomy.template()
    assert isinstance(template, ChainedRegistration)
    doc.set_cursor((10, 14, 12))
    world = doc.cursor_world()
    x, y, z = t1_to_mni.moving_to_fixed(t1_to_dwi.fixed_to_moving(world))[0]  # DWI → T1 → MNI, by hand
    assert window.anatomy.mni_label.text() == f"MNI ({x:.1f}, {y:.1f}, {z:.1f}) mm"
    trigger(window, "ROI", "Add atlas region…")  # no longer refused
    dialog = window.anatomy.atlas_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=3000)
    dialog.atlas_box.setCurrentIndex(dialog.atlas_box.findData("harvard-oxford-subcortical"))
    qtbot.keyClicks(dialog.search, "thalamus")
    dialog.side_box.setCurrentIndex(dialog.side_box.findData("left"))
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert window.wait_for_jobs(60) and window.errors == [], window.errors
    roi = doc.layer("Left_Thalamus")
    assert roi.data.mask.sum() > 50 and "T1w" in roi.provenance["registration"]["describe"]
