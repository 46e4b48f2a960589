"""The window and DICOM: a CD folder dropped on it opens (the series chooser asks which of two
diffusion series), and File ▸ Export for navigation… writes SEG, RTSTRUCT and the coloured
series in a background job; the screenshots are kept in tests/_artifacts."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QImage

pydicom = pytest.importorskip("pydicom")
pytest.importorskip("highdicom")
pytest.importorskip("dcm2niix")

from nibabel.streamlines import Tractogram, save  # noqa: E402

from tests.conftest import ARTIFACTS  # noqa: E402
from tests.dicom_synth import gradient_table, make_affine, tensor_signal, write_series  # noqa: E402
from tractlens.app.report_data import parameters_in_words  # noqa: E402
from tractlens.widgets import dialogs  # noqa: E402

SHAPE = (24, 24, 8)
STUDY, FRAME = "1.2.826.0.1.3680043.8.498.2001", "1.2.826.0.1.3680043.8.498.2002"


@pytest.fixture
def cd(tmp_path, monkeypatch):
    """A patient CD: two diffusion series and a T1 of one session (one frame of reference)."""
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))
    affine = make_affine(spacing=(2.0, 2.0, 2.0))
    bvals, bvecs = gradient_table(12)
    signal = tensor_signal(SHAPE, bvals, bvecs, affine)
    folder = tmp_path / "CD"
    for number, description in ((5, "ep2d_diff_b1000"), (6, "ep2d_diff_b1000_repeat")):
        write_series(folder / f"S{number}", signal, affine, bvals=bvals, bvecs_world=bvecs, series_number=number,
                     description=description, study_uid=STUDY, frame_uid=FRAME)  # fmt: skip
    ii, jj, kk = np.indices(SHAPE)
    t1 = 300 + 500 * np.exp(-((ii - 12) ** 2 + (jj - 12) ** 2) / 60.0) + 20 * kk
    write_series(folder / "S2", t1, affine, description="T1w MPRAGE", series_number=2, study_uid=STUDY,
                 frame_uid=FRAME)  # fmt: skip
    centre = affine[:3, :3] @ np.array([12.0, 12.0, 4.0]) + affine[:3, 3]
    lines = [np.stack([centre + np.array([t, 2.0 * s, 2.0 * z]) for t in np.linspace(-14, 14, 30)]) for s in (-1, 0, 1)
             for z in (-1, 0)]  # fmt: skip
    save(Tractogram([line.astype(np.float32) for line in lines], affine_to_rasmm=np.eye(4)), str(tmp_path / "cc.tck"))
    return folder


def _drop(window, path):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)  # fmt: skip
    window.dropEvent(event)


def _action(window, text):
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if action.text() == text:
                return action
    raise AssertionError(f"no menu item {text!r}")


def test_drop_a_dicom_folder_choose_the_series_and_export_for_navigation(window, cd, tmp_path, qtbot):
    assert _action(window, "Open D&ICOM folder…") is not None
    with dialogs.answers(series=["6"]):
        _drop(window, cd)
        assert window.wait_for_jobs(120)
        assert window.wait_for_jobs(120)  # the listing job starts the conversion job
    assert window.errors == []
    names = [layer.name for layer in window.document.layers]
    assert "ep2d_diff_b1000_repeat" in names and "FA" in names and "T1w MPRAGE" in names
    dwi = next(layer for layer in window.document.layers if layer.kind == "dwi")
    assert dwi.provenance["dicom"]["frame_of_reference_uid"] == FRAME
    window.open_paths([tmp_path / "cc.tck"])
    assert window.wait_for_jobs(60) and window.errors == []

    out = tmp_path / "navigation"
    with dialogs.answers(navigation_export=[{"outdir": str(out)}]):  # onto the T1 opened: the default
        _action(window, "Export for na&vigation…").trigger()
        assert window.wait_for_jobs(120)
    assert window.errors == []
    assert window.job_panel.detail.text() == "export for navigation: done"
    seg = pydicom.dcmread(next((out / "SEG").glob("*.dcm")))
    assert seg.Modality == "SEG" and seg.FrameOfReferenceUID == FRAME and seg.StudyInstanceUID == STUDY
    assert seg.SegmentSequence[0].SegmentLabel == "cc"
    assert (out / "RTSTRUCT").is_dir() and len(list((out / "OVERLAY").glob("*.dcm"))) == SHAPE[2]
    tract = next(layer for layer in window.document.layers if layer.kind == "tractogram")
    assert any("exported for navigation" in phrase for phrase in parameters_in_words(tract.provenance))

    window.save_screenshot(ARTIFACTS / "dicom_window.png")
    middle = pydicom.dcmread(sorted((out / "OVERLAY").glob("*.dcm"))[SHAPE[2] // 2])
    rgb = np.ascontiguousarray(middle.pixel_array)
    image = QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1], QImage.Format.Format_RGB888)
    image.scaled(rgb.shape[1] * 12, rgb.shape[0] * 12).save(str(ARTIFACTS / "dicom_overlay_slice.png"))
    assert "not for diagnosis" in middle.SeriesDescription
    assert (rgb.max(axis=-1).astype(int) - rgb.min(axis=-1) > 10).sum() > 20  # the bundle is drawn in colour

    # nobody to ask and no answer queued: nothing is written; a bad answer is one clear error
    _action(window, "Export for na&vigation…").trigger()
    with dialogs.answers(navigation_export=[{"outdir": ""}]):
        _action(window, "Export for na&vigation…").trigger()
    assert window.wait_for_jobs(60) and len(window.errors) == 1 and "folder to write" in str(window.errors[0])
    window.errors.clear()
    # another reference folder (its only series), SEG only, dilated, de-identified
    second = tmp_path / "navigation-2"
    answer = {"outdir": str(second), "reference": str(cd / "S2"), "formats": "seg", "dilate_mm": 2.0,
              "deidentify": True}  # fmt: skip
    with dialogs.answers(navigation_export=[answer]):
        _action(window, "Export for na&vigation…").trigger()
        assert window.wait_for_jobs(120)
    assert window.errors == [] and sorted(p.name for p in second.iterdir()) == ["SEG"]
    seg2 = pydicom.dcmread(next((second / "SEG").glob("*.dcm")))
    assert not str(seg2.PatientName) and seg2.PatientIdentityRemoved == "YES"

    from tractlens.widgets.report import gather

    exports = gather(window).exports
    assert [e["outdir"] for e in exports] == [str(second)] and exports[0]["dilate_mm"] == 2.0
    written = window.export_report(ARTIFACTS / "dicom_report.pdf")
    assert written[0].suffix == ".pdf" and written[1].suffix == ".png"  # look at the section in the PNG


def test_several_diffusion_series_and_no_choice_opens_nothing_and_says_why(window, cd):
    _drop(window, cd)  # scripted: the chooser answers None
    assert window.wait_for_jobs(60)
    assert window.document.layers == []
    assert any("several diffusion series" in error for error in map(str, window.errors))


def test_view_a_folder_with_several_diffusion_series_names_series_and_opens_the_one_chosen(cd, capsys, monkeypatch):
    from tractlens.widgets import launcher

    monkeypatch.setattr(dialogs, "_scripted", dialogs._scripted)  # the launcher marks the run scripted
    opened = []
    make_window = launcher._window

    def keep(args, *, scripted):
        app, window = make_window(args, scripted=scripted)
        opened.append(window)
        return app, window

    monkeypatch.setattr(launcher, "_window", keep)
    assert launcher.run_gui(["view", str(cd), "--exit", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "several diffusion series" in err and "tractlens view DIR --series NUMBER" in err
    assert opened[-1].document.layers == []
    assert launcher.run_gui(["view", str(cd), "--series", "6", "--exit", "--device", "cpu"]) == 0
    names = [layer.name for layer in opened[-1].document.layers]
    assert "ep2d_diff_b1000_repeat" in names and "ep2d_diff_b1000" not in names and "T1w MPRAGE" in names
    with pytest.raises(SystemExit):
        launcher.run_gui(["view", str(cd / "S2" / "missing.nii.gz"), "--series", "6", "--exit"])
    assert "--series chooses a series of a DICOM folder" in capsys.readouterr().err


def test_export_dialog_is_the_params_form_with_de_identification_off_and_said_so(qtbot, tmp_path):
    """File ▸ Export for navigation…'s form: the objects, dilation and de-identification come from
    DicomExportParams; a bad entry is said in the dialog, which stays open with what was entered."""
    from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox

    from tractlens.app.params import DicomExportParams

    reference = tmp_path / "T1"
    reference.mkdir()
    defaults = {"formats": DicomExportParams().formats, "dilate_mm": 0.0, "deidentify": False,
                "reference": str(reference), "reference_series": "1.2.3", "outdir": "",
                "bundles": ["CST left"], "lesion": "lesion"}  # fmt: skip
    dialog = dialogs._NavigationExportDialog(None, defaults, [("CST left", True), ("AF left", False)],
                                             ["lesion"], 'series 2 "T1w MPRAGE"')  # fmt: skip
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    editors = dialog.form.editors
    boxes = {name: box.isChecked() for name, box in editors["formats"].boxes.items()}
    assert boxes == {"seg": True, "rtstruct": True, "overlay": True, "tractography": False}
    assert isinstance(editors["dilate_mm"], QDoubleSpinBox) and editors["dilate_mm"].suffix() == " mm"
    assert isinstance(editors["deidentify"], QCheckBox) and not editors["deidentify"].isChecked()
    assert dialog.deidentify_note.isVisible() and "OFF" in dialog.deidentify_note.text()
    dialog.grab().save(str(ARTIFACTS / "dicom_export_dialog.png"))

    for box in editors["formats"].boxes.values():
        box.setChecked(False)
    dialog.accept()
    assert dialog.isVisible() and dialog.choice is None and "at least one DICOM object" in dialog.problem.text()
    editors["formats"].boxes["seg"].setChecked(True)
    editors["deidentify"].setChecked(True)
    assert "ON" in dialog.deidentify_note.text()
    editors["dilate_mm"].setValue(1.5)
    dialog.accept()
    assert dialog.isVisible() and "folder to write" in dialog.problem.text()
    dialog.outdir.setText(str(tmp_path / "out"))
    dialog.accept()
    assert not dialog.isVisible()
    choice = dialog.choice
    assert choice["params"] == DicomExportParams(formats="seg", dilate_mm=1.5, deidentify=True)
    assert choice["bundles"] == ["CST left"] and choice["lesion"] == "lesion"
    assert choice["reference"] == str(reference) and choice["reference_series"] == "1.2.3"
