"""The clinician's workflow, end to end, through the real window (issue 22): menus, file dialogs
(scripted answers), layer menus and mouse strokes, on the demo data.

After every step: no error was shown (the window's error list, which the status bar and the
error boxes are fed from), the autosave was written and loads back with the same layers, and a
screenshot is kept under ``tests/_artifacts/workflow/``. At the end the session is saved with
File ▸ Save session, reopened in a second window with File ▸ Open session…, and every layer
compared. Small seeds and few samples keep it short on a CPU.
"""

from __future__ import annotations

import gc
import time

import nibabel as nib
import numpy as np
from PySide6.QtCore import QPoint, Qt

from tests.conftest import ARTIFACTS
from tests.gui.actions import choose_from_layer_menu
from tractlens.app.session import load_session
from tractlens.widgets import dialogs
from tractlens.widgets.controllers.menus import plain, window_actions
from tractlens.widgets.panels import FILTER_COMMIT, FIT_BALLSTICK

SHOTS = ARTIFACTS / "workflow"


def menu_action(window, path: str):
    """The action at ``"File ▸ Open…"`` (mnemonics ignored)."""
    menu, text = path.rsplit(" ▸ ", 1)
    return next(a for where, a in window_actions(window) if where == menu and plain(a.text()) == text)


def trigger(window, path: str, **answers) -> None:
    with dialogs.answers(**answers):
        menu_action(window, path).trigger()


def stroke(qtbot, view, voxels) -> None:
    """Press, drag through ``voxels`` and release on a slice view (the brush paints)."""
    points = [view.widget_point_of_voxel(v) for v in voxels]
    points = [QPoint(int(p.x()), int(p.y())) for p in points]
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=points[0])
    for point in points[1:]:
        qtbot.mouseMove(view, pos=point)
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=points[-1])


def arrays_of(layer) -> dict[str, np.ndarray]:
    """The arrays a layer's data holds (mask, image, points, offsets), for comparing layers."""
    found = {}
    for name in ("mask", "data", "points", "offsets"):
        value = getattr(layer.data, name, None)
        if isinstance(value, np.ndarray):
            found[name] = value
    return found


def assert_same_layers(reopened, original, where: str) -> None:
    assert [(layer.name, layer.kind) for layer in reopened] == [(layer.name, layer.kind) for layer in original], where
    for new, old in zip(reopened, original):
        assert new.visible == old.visible, f"{where}: {old.name} visibility"
        old_arrays, new_arrays = arrays_of(old), arrays_of(new)
        assert set(new_arrays) == set(old_arrays), f"{where}: {old.name} arrays"
        for name, value in old_arrays.items():
            np.testing.assert_allclose(
                new_arrays[name], value, rtol=1e-6, atol=1e-6, err_msg=f"{where}: {old.name}.{name}"
            )


class Workflow:
    """Steps and the checks after each."""

    def __init__(self, window, qtbot):
        self.window, self.qtbot, self.step = window, qtbot, 0
        self.autosaves: list[str] = []
        window.autosave.saved.connect(lambda: self.autosaves.append("saved"))
        window.autosave.failed.connect(lambda message: self.autosaves.append(f"failed: {message}"))
        SHOTS.mkdir(parents=True, exist_ok=True)

    def done(self, name: str, timeout_s: float = 120.0) -> None:
        window = self.window
        self.step += 1
        where = f"step {self.step} ({name})"
        assert window.wait_for_jobs(timeout_s), f"{where}: jobs did not finish"
        assert window.errors == [], f"{where}: errors shown: {window.errors}"
        window.view3d.request_render()
        self.qtbot.wait(20)
        window.save_screenshot(SHOTS / f"{self.step:02d}_{name}.png")
        self.check_autosave(where)

    def check_autosave(self, where: str) -> None:
        """An autosave after the step holds every layer as the window has it. A step that changed
        no layer (a connectome is a table, not a layer) has nothing new to write: the autosave
        then writes nothing, and the one on disk must still equal the document."""
        window = self.window
        folder = window.autosave.store.folder
        saver = window.autosave.saver
        writes, count = saver.writes, len(self.autosaves)
        assert window.autosave.save_now(), f"{where}: an autosave was still running"
        self.qtbot.waitUntil(lambda: not saver.busy, timeout=60_000)
        self.qtbot.wait(10)  # the saved/failed signal crosses to the GUI thread
        new = self.autosaves[count:]
        assert not any(entry.startswith("failed") for entry in new), f"{where}: autosave {new}"
        if saver.writes > writes:
            assert new and new[-1] == "saved", f"{where}: a write without its 'saved' signal ({new})"
        assert window.errors == [], f"{where}: errors after the autosave: {window.errors}"
        session = load_session(folder)
        assert_same_layers(session.document.layers, window.document.layers, f"{where}, autosave")


def test_a_clinician_runs_the_whole_workflow_and_reopens_it(window, qtbot, demo_dir, tmp_path):
    start = time.perf_counter()
    window.set_autosave_interval(0)  # autosaves only when the test asks, after each step
    doc = window.document
    flow = Workflow(window, qtbot)

    # 1. File ▸ Open… the demo DWI (gradients beside it): DTI fitted on load.
    trigger(window, "File ▸ Open…", open_files=[[str(demo_dir / "dwi.nii.gz")]])
    flow.done("open_dwi")
    assert {"dwi", "FA", "colour FA", "tensors"} <= {layer.name for layer in doc.layers}

    # 2. Glyphs: tick the tensors layer in the layer list.
    item = window.layer_panel.item_for(doc.layer("tensors"))
    item.setCheckState(Qt.CheckState.Checked)
    assert doc.layer("tensors").visible
    flow.done("glyphs")

    # 3. Draw a seed: Edit ▸ New ROI (role seed), a brush stroke over the arc bundle's seed region.
    seed_file = np.asarray(nib.load(demo_dir / "roi_arc_seed.nii.gz").dataobj) > 0
    centre = np.rint(np.argwhere(seed_file).mean(axis=0)).astype(int)
    doc.set_cursor(tuple(int(v) for v in centre))
    window.role_box.setCurrentText("seed")
    trigger(window, "Edit ▸ New ROI")
    seed = window.layer_panel.selected_layer()
    assert seed is not None and seed.kind == "roi" and seed.data.role == "seed"
    window.radius_box.setValue(1)
    axial = window.views["axial"]
    qtbot.wait(50)
    i, j, k = (int(v) for v in centre)
    stroke(qtbot, axial, [(i - 1, j, k), (i, j, k), (i + 1, j, k)])
    assert seed.data.voxel_count > 0, "the stroke painted nothing"
    trigger(window, "Edit ▸ Navigate")  # done painting
    flow.done("seed_drawn")

    # 4. File ▸ Open ROI… the target (role target).
    window.role_box.setCurrentText("target")
    trigger(window, "File ▸ Open ROI…", open_files=[[str(demo_dir / "roi_arc_target.nii.gz")]])
    flow.done("target_opened")
    assert doc.layer("roi_arc_target").data.role == "target"

    # 5. Track ▸ Deterministic, then Track ▸ Geodesic (small settings).
    window.deterministic_panel.form.editors["min_length_mm"].setValue(5.0)
    trigger(window, "Track ▸ Deterministic (tensor)")
    flow.done("deterministic")
    deterministic = window.deterministic_panel.result_layer
    assert deterministic is not None and len(deterministic.data) > 0
    window.geodesic_panel.directions.setValue(12)
    trigger(window, "Track ▸ Geodesic (ray tracing)")
    flow.done("geodesic", 180)
    assert window.geodesic_panel.result_layer is not None

    # 6. Ball & sticks in the seed ROI from the DWI layer's menu, then Track ▸ Probabilistic.
    choose_from_layer_menu(window, qtbot, doc.layer("dwi"), FIT_BALLSTICK)
    qtbot.waitUntil(lambda: window.ballstick_dialog is not None and window.ballstick_dialog.isVisible(), timeout=3000)
    dialog = window.ballstick_dialog
    dialog.region.setCurrentIndex(1 + dialog.rois.index(seed))
    for box, value in ((dialog.n_fibres, 2), (dialog.burnin, 20), (dialog.njumps, 20), (dialog.sample_every, 4)):
        box.setValue(value)
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    flow.done("ballstick_in_roi")
    assert window.probabilistic_panel.samples_layer() is not None
    window.probabilistic_panel.form.editors["n_samples"].setValue(20)
    trigger(window, "Track ▸ Probabilistic (probtrackx)")
    flow.done("probabilistic")
    assert window.probabilistic_panel.result_layer in doc.layers

    # 7. COMMIT on the deterministic fibres from their layer menu.
    choose_from_layer_menu(window, qtbot, deterministic, FILTER_COMMIT)
    window.commit_panel.max_iter_box.setValue(50)
    qtbot.mouseClick(window.commit_panel.filter_button, Qt.MouseButton.LeftButton)
    flow.done("commit")

    # 8. A connectome over the demo parcellation: File ▸ Open…, Analysis ▸ Connectivity matrix…
    trigger(window, "File ▸ Open…", open_files=[[str(demo_dir / "parcellation.nii.gz")]])
    flow.done("parcellation_opened")
    trigger(window, "Analysis ▸ Connectivity matrix…")
    panel = window.connectivity_panel
    panel.tract_box.choose(deterministic)
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    flow.done("connectome")
    assert panel.matrix is not None

    # 9. Distance to the lesion: File ▸ Open… the lesion, Analysis ▸ Distance to lesion…, Measure.
    lesion_file = demo_dir / "tumour.nii.gz"
    lesion_file = lesion_file if lesion_file.exists() else demo_dir / "lesion.nii.gz"
    trigger(window, "File ▸ Open…", open_files=[[str(lesion_file)]])
    flow.done("lesion_opened")
    trigger(window, "Analysis ▸ Distance to lesion…")
    presurgical = window.presurgical_panel
    assert presurgical.lesion_box.layer() is doc.layer(lesion_file.name.split(".")[0]), "the lesion chosen"
    qtbot.mouseClick(presurgical.measure_button, Qt.MouseButton.LeftButton)
    flow.done("distance_to_lesion")
    assert presurgical.rows

    # 10. File ▸ Export report… (PDF).
    pdf = tmp_path / "planning.pdf"
    trigger(window, "File ▸ Export report…", save_file=[str(pdf)])
    flow.done("report")
    assert pdf.exists() and pdf.stat().st_size > 10_000

    # 11. File ▸ Save session (Ctrl+S asks where the first time), then reopen it in a new window.
    saved = tmp_path / "case.tractlens"
    trigger(window, "File ▸ Save session", save_file=[str(saved)])
    flow.done("session_saved")
    assert saved.exists()
    elapsed = time.perf_counter() - start

    from tractlens.widgets.main_window import MainWindow

    second = MainWindow(device="cpu", autosave_s=0)
    qtbot.addWidget(second)
    second.resize(1400, 900)
    second.show()
    try:
        trigger(second, "File ▸ Open session…", open_file=[str(saved)])
        assert second.wait_for_jobs(60) and second.errors == []
        assert_same_layers(second.document.layers, doc.layers, "reopened session")
        second.save_screenshot(SHOTS / f"{flow.step + 1:02d}_session_reopened.png")
    finally:
        second.runner.shutdown(10)
        second.close()
        gc.collect()
    print(f"\nthe workflow took {elapsed:.0f} s")  # a number to read, not a verdict: the machine is shared
