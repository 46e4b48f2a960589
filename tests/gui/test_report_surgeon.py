"""Issue 22: a report a surgeon can file — patient and scan fields from the sidecar, edited before
writing and kept in the session; parameters in words; no inf; legible text; the statistics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import unicodedata

from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS

SIDECAR = {
    "PatientName": "DOE^JANE",
    "PatientID": "P-0042",
    "PatientBirthDate": "19700412",
    "StudyDate": "20260228",
    "SeriesDescription": "DTI_64dir_b1000",
    "Manufacturer": "Siemens",
    "ManufacturersModelName": "Prisma",
    "MagneticFieldStrength": 3,
}


def _words_with_heights(pdf) -> list[tuple[str, float]]:
    html = subprocess.run(["pdftotext", "-bbox", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    pattern = r'<word xMin="[\d.]+" yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)">([^<]*)</word>'
    return [(word, float(y1) - float(y0)) for y0, y1, word in re.findall(pattern, html)]


def test_report_names_patient_and_scan_says_parameters_in_words_and_is_legible(demo_window, demo_dir, qtbot, tmp_path):
    from tractlens.widgets import dialogs

    win = demo_window
    shutil.copy(demo_dir / "lesion.nii.gz", tmp_path / "lesion.nii.gz")
    (tmp_path / "lesion.json").write_text(json.dumps(SIDECAR))
    win.open_paths([tmp_path / "lesion.nii.gz"])
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    target = win.open_roi(demo_dir / "roi_crossing_lr_target.nii.gz", role="target")
    target.set(visible=False)
    assert win.wait_for_jobs(60)
    qtbot.mouseClick(win.deterministic_panel.track_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(120)
    win.document.layer("deterministic").set(filter_by_rois=True)  # the user's choice, per layer
    target.set(visible=True)  # a selection that shows no fibre: the report must say so, not print inf
    qtbot.waitUntil(lambda: "target" in (win.document.layer("deterministic").selection_by or ""), timeout=10_000)
    win.presurgical_panel.measure()
    assert win.wait_for_jobs(60) and win.errors == []

    pdf = tmp_path / "report.pdf"
    with dialogs.answers(save_file=[pdf], fields=[{"patient_id": "P-0042-edited"}]):
        win.reports.report_dialog()
    assert pdf.exists() and win.errors == []
    text = unicodedata.normalize(
        "NFKC", subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    )
    for expected in ("DOE JANE", "P-0042-edited", "1970-04-12", "2026-02-28", "DTI_64dir_b1000", "Siemens Prisma"):
        assert expected in text, expected
    assert re.search(r"3\s?T\b", text)  # the field strength
    assert re.search(r"step\s+0\.5 mm", text) and "stop below FA" in text  # a table: setting, value
    assert "Statistics" in text and "0 of" in text and "shown" in text
    for forbidden in ("inf", "nan", "transfer_s", "batches", "tracking_s", "device_choice"):
        assert not re.search(rf"\b{forbidden}\b", text), forbidden
    heights = [h for word, h in _words_with_heights(pdf) if word.strip()]
    assert min(heights) >= 9.0, min(heights)  # ≥ 9 pt text (a word box is ~1.15 × the font size)
    subprocess.run(["pdftoppm", "-png", "-r", "70", str(pdf), str(ARTIFACTS / "report_surgeon")], check=True)

    with dialogs.answers(save_file=[tmp_path / "cancelled.pdf"], fields=[None]):  # the form cancelled
        win.reports.report_dialog()
    assert not (tmp_path / "cancelled.pdf").exists()

    win.save_session(tmp_path / "case.tractlens")  # the edited fields are kept with the session
    assert win.wait_for_jobs(60) and win.errors == []
    win.reports.scan_info = None
    win.open_session(tmp_path / "case.tractlens")
    assert win.wait_for_jobs(60) and win.errors == []
    assert win.reports.scan_info is not None and win.reports.scan_info.patient_id == "P-0042-edited"
