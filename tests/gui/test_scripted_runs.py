"""A run nobody watches never waits for a click (issue: scripted runs).

``tractlens --exit/--screenshot``, ``tractlens report`` and ``open_window`` from a script show no
dialog: each dialog has a scripted answer (``widgets.dialogs``), a crashed window's autosave is
kept for the next interactive start and one line on stderr says so. And the suite itself runs
with private XDG folders, leaving nothing in the user's real ones.
"""

from __future__ import annotations

import ast
import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import installed_tool
from tests.gui.test_recovery import _orphan_of

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED_TIMEOUT_S = 240  # a dialog waiting for a click would hang the run until this


def _tractlens(args, env_extra) -> subprocess.CompletedProcess:
    exe = installed_tool("tractlens")
    cmd = [exe] if exe else [sys.executable, "-m", "tractlens"]
    env = {k: v for k, v in os.environ.items() if k != "TRACTLENS_NO_DIALOGS"}  # as a user's shell has it
    env.update(env_extra)
    try:
        return subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=SCRIPTED_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"tractlens {' '.join(args)} still running after {SCRIPTED_TIMEOUT_S} s (waiting for a click?): {exc}"
        )


def test_a_screenshot_run_with_a_dead_autosave_finishes_and_keeps_it(qtbot, tmp_path):
    folder = _orphan_of(qtbot, tmp_path)
    shot = tmp_path / "shot.png"
    result = _tractlens(
        ["--demo", "--device", "cpu", "--screenshot", str(shot), "--size", "1000x700", "--exit"],
        {"TRACTLENS_CONFIG_DIR": os.environ["TRACTLENS_CONFIG_DIR"]},
    )
    assert result.returncode == 0, result.stderr
    assert shot.stat().st_size > 10_000
    assert folder.exists() and (folder / "manifest.json").exists()  # kept for the next interactive start
    kept_lines = [line for line in result.stderr.splitlines() if "autosave" in line and "kept" in line]
    assert len(kept_lines) == 1 and str(folder) in kept_lines[0], result.stderr
    recovery = folder.parent
    assert sorted(p.name for p in recovery.iterdir()) == [folder.name]  # the scripted run left no autosave


def test_a_report_run_with_a_dead_autosave_finishes_and_keeps_it(qtbot, tmp_path):
    from tractlens.app.model import Document, Layer, Volume
    from tractlens.app.session import save_session

    document = Document()
    fa = np.zeros((12, 10, 8), np.float32)
    fa[3:9, 3:7, 2:6] = 0.6
    document.add_layer(Layer("FA", Volume("FA", fa, np.diag([2.0, 2.0, 2.0, 1.0])), "scalar"))
    session = save_session(document, tmp_path / "case.tractlens")
    folder = _orphan_of(qtbot, tmp_path)
    pdf = tmp_path / "report.pdf"
    result = _tractlens(
        ["report", str(session), "-o", str(pdf), "--size", "1000x700", "--device", "cpu"],
        {"TRACTLENS_CONFIG_DIR": os.environ["TRACTLENS_CONFIG_DIR"]},
    )
    assert result.returncode == 0, result.stderr
    assert pdf.read_bytes().startswith(b"%PDF")
    assert folder.exists() and "kept" in result.stderr
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_open_window_from_a_script_shows_no_dialog_and_keeps_the_autosave(qtbot, tmp_path, monkeypatch, capfd):
    from tractlens.widgets import dialogs
    from tractlens.widgets.api import open_window

    folder = _orphan_of(qtbot, tmp_path)
    monkeypatch.delenv("TRACTLENS_NO_DIALOGS")  # only the scripted mode stands between us and a dialog
    window = open_window(device="cpu", size=(900, 600))
    qtbot.addWidget(window)
    qtbot.wait(100)
    assert not dialogs.interactive()
    assert folder.exists() and window.document.layers == []
    assert "kept" in capfd.readouterr().err
    window.runner.shutdown(10)
    window.close()


def test_every_dialog_of_the_window_answers_at_once_in_a_scripted_run(window, qtbot, monkeypatch):
    """Trigger every menu action that would open a dialog, with dialogs allowed by the environment
    but the run scripted: none may show a modal window (a watchdog closes any and fails)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QApplication, QMenu

    from tractlens.widgets import dialogs

    monkeypatch.delenv("TRACTLENS_NO_DIALOGS")
    dialogs.set_scripted(True)
    shown = []

    def watchdog():
        modal = QApplication.activeModalWidget()
        if modal is not None:
            shown.append(modal.windowTitle())
            modal.close()

    timer = QTimer()
    timer.timeout.connect(watchdog)
    timer.start(50)
    from tractlens.app.model import Layer, Volume

    window.document.add_layer(Layer("FA", Volume("FA", np.ones((8, 8, 6), np.float32), np.eye(4)), "scalar"))
    window.new_roi()
    before = [layer.name for layer in window.document.layers]
    gc.collect()  # stale wrappers of deleted Qt objects (earlier tests) must not alias the actions
    asking = [
        action
        for menu in window.menuBar().findChildren(QMenu)
        for action in menu.actions()
        if isinstance(action, QAction) and action.text().endswith("…") and action.isEnabled()
    ]
    assert len(asking) >= 8  # open, folder, screenshot, report, sessions, autosave, ROI open/save...
    for action in asking:
        action.trigger()
        qtbot.wait(60)
    timer.stop()
    assert shown == [], f"dialogs shown in a scripted run: {shown}"
    assert [layer.name for layer in window.document.layers] == before  # the defaults opened nothing
    assert dialogs.question(window, "Replace?", "Replace it?") is False
    assert dialogs.choice(window, "t", "x", [("yes", "Yes"), ("no", "No")], default="no") == "no"
    with dialogs.answers(question=[True], folder=["/data"]):
        assert dialogs.question(window, "Replace?", "Replace it?") is True
        assert dialogs.folder(window, "Folder") == "/data"
        assert dialogs.folder(window, "Folder") is None  # the queue is used up: the default again


def test_only_the_dialogs_module_opens_dialogs():
    """Every modal dialog goes through widgets/dialogs.py, so each has a scripted answer. (A
    settings form may derive from QDialog, shown with the non-blocking ``open()`` when the user
    asks for it; a blocking ``exec()`` anywhere else is refused.)"""
    modal = {"QFileDialog", "QMessageBox", "QInputDialog", "QColorDialog"}
    offenders = []
    for path in (ROOT / "widgets").rglob("*.py"):
        if path.name == "dialogs.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if name in modal or (isinstance(node, ast.Attribute) and node.attr == "exec" and _is_call(tree, node)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert offenders == [], "\n".join(offenders)


def _is_call(tree, attribute) -> bool:
    """``x.exec()`` called on something other than the application (``app.exec()`` runs the loop)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.func is attribute:
            return not (isinstance(attribute.value, ast.Name) and attribute.value.id == "app")
    return False


def test_the_suite_runs_with_private_xdg_folders(monkeypatch):
    from tests._private_home import MARK, XDG_DEFAULTS
    from tractlens.app.recovery import recovery_root

    private = [Path(os.environ[name]) for name in XDG_DEFAULTS]
    assert all("tractlens-tests-home-" in str(p) for p in private)
    assert Path.home() == Path(os.environ[MARK])  # the session's private home (tests/test_private_home.py)
    monkeypatch.delenv("TRACTLENS_CONFIG_DIR")
    assert any(recovery_root().is_relative_to(p) for p in private)
