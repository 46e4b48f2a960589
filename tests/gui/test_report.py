"""The presurgical report (File > Export report, `tractlens report SESSION`) and sessions in the window."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from tests.conftest import ARTIFACTS
from tractlens.app.pipelines.connectivity import DISTANCE_STREAMLINE_SCALAR


def _pdf_pages(path) -> int:
    assert shutil.which("pdfinfo") and shutil.which("pdftoppm"), "poppler-utils missing: run packaging/install-deps.sh"
    info = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True, check=True).stdout
    return int(next(line.split()[-1] for line in info.splitlines() if line.startswith("Pages:")))


def _pdf_text(path) -> str:
    """The PDF's text as a reader copies it (ligatures such as "ﬁ" spelled out)."""
    text = subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True, check=True).stdout
    return unicodedata.normalize("NFKC", text)


def _render_first_page(pdf, stem: str):
    """pdftoppm's rendering of page 1 (what a PDF viewer shows), kept as an artifact to look at."""
    subprocess.run(["pdftoppm", "-png", "-r", "60", "-f", "1", "-l", "1", str(pdf), str(ARTIFACTS / stem)], check=True)
    rendered = sorted(ARTIFACTS.glob(f"{stem}*.png"))[-1]
    from PySide6.QtGui import QImage

    image = QImage(str(rendered))
    assert image.width() > 400 and image.height() > 600  # A4 portrait at 60 dpi: 496 x 702
    pixels = np.array(
        [image.pixelColor(x, y).lightness() for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)]
    )
    assert pixels.std() > 20  # text and pictures, not a blank page
    return rendered


@pytest.fixture
def measured_window(demo_window, qtbot, demo_dir):
    window = demo_window
    window.open_paths([demo_dir / "lesion.nii.gz"])
    assert window.wait_for_jobs(60) and window.errors == []
    panel = window.presurgical_panel
    panel.margin_box.setValue(4.0)
    panel.measure()
    assert window.wait_for_jobs(60) and window.errors == []
    qtbot.waitUntil(lambda: bool(panel.rows), timeout=10_000)
    return window


def test_export_report_pdf_and_png(measured_window, tmp_path):
    from tractlens.widgets.report import export_report

    window = measured_window
    files = export_report(window, tmp_path / "report.pdf")
    pdf, pngs = files[0], files[1:]
    assert pdf.name == "report.pdf" and pdf.stat().st_size > 10_000
    assert _pdf_pages(pdf) == len(pngs) == 1  # the demo's report fits on one page
    text = _pdf_text(pdf)
    rows = window.presurgical_panel.rows
    bundles = next(r for r in rows if r.name == "bundles")
    assert "Distance to the lesion 'lesion' · safety margin 4 mm" in text
    assert f"{bundles.min_mm:.1f}" in text and str(bundles.within_margin) in text
    assert "Results and provenance" in text and "diffusion tensor fit" in text
    rendered = _render_first_page(pdf, "report_page")
    shutil.copy(pngs[0], ARTIFACTS / "report_qt.png")
    assert rendered.exists()
    assert not list(tmp_path.glob(".*tmp*"))


def test_saved_session_reopens_and_reports_from_the_command_line(measured_window, tmp_path, qtbot):
    window = measured_window
    before = window.document.layer("bundles").data.streamline_scalars[DISTANCE_STREAMLINE_SCALAR].copy()
    window.save_session(tmp_path / "planning")  # File > Save session, on a worker
    assert window.wait_for_jobs(60) and window.errors == []
    path = tmp_path / "planning.tractlens"
    assert path.is_file()

    # in a window (as File > Open recent or drag and drop do): the same layers, distances and
    # margin come back, without recomputing
    window.presurgical_panel.margin_box.setValue(9.0)
    window.open_paths([path])
    assert window.wait_for_jobs(60) and window.errors == []
    names = [layer.name for layer in window.document.layers]
    assert "bundles" in names and "lesion" in names
    np.testing.assert_array_equal(
        window.document.layer("bundles").data.streamline_scalars[DISTANCE_STREAMLINE_SCALAR], before
    )
    assert window.presurgical_panel.margin_mm == 4.0
    assert next(r.min_mm for r in window.presurgical_panel.rows if r.name == "bundles") == pytest.approx(before.min())
    assert window.document.layer("bundles").provenance["lesion distance"]["lesion"] == "lesion"

    # the command line: tractlens report SESSION -o report.pdf
    out = tmp_path / "cli" / "report.pdf"
    env = dict(os.environ, TRACTLENS_NO_DIALOGS="1")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from widgets.launcher import main; sys.exit(main())", "report", str(path), "-o", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert out.exists() and (out.parent / "report.png").exists() and _pdf_pages(out) == 1
    text = _pdf_text(out)
    assert "safety margin 4 mm" in text and f"{before.min():.1f}" in text
    _render_first_page(out, "report_cli_page")

    bad = subprocess.run(
        [sys.executable, "-c", "import sys; from widgets.launcher import main; sys.exit(main())", "report", str(tmp_path / "none.tractlens"), "-o", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
