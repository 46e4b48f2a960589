"""Menus a clinician expects: standard shortcuts, no shortcut twice, the File menu in the usual
order, Help ▸ Keyboard shortcuts generated from the actions; gradient files chosen in the window;
long CPU jobs announced with their estimate before they start."""

from __future__ import annotations

import shutil

import pytest
from PySide6.QtGui import QAction, QKeySequence

from tests.conftest import ARTIFACTS
from tractlens.widgets import dialogs
from tractlens.widgets.controllers.help import shortcut_rows, shortcuts_html
from tractlens.widgets.controllers.menus import plain, window_actions


def _menu(window, title):
    return next(a.menu() for a in window.menuBar().actions() if plain(a.text()) == title)


def _by_shortcut(window, keys: str) -> list[str]:
    wanted = QKeySequence(keys)
    return [plain(a.text()) for a in window.findChildren(QAction) if wanted in a.shortcuts()]


def test_no_two_actions_share_a_shortcut(window):
    seen: dict[str, list[str]] = {}
    for action in window.findChildren(QAction):
        for sequence in action.shortcuts():
            if not sequence.isEmpty():
                seen.setdefault(sequence.toString(), []).append(plain(action.text()))
    twice = {keys: names for keys, names in seen.items() if len(names) > 1}
    assert twice == {}
    assert len(seen) >= 20  # the collection found the menus' shortcuts


def test_standard_shortcuts_reach_the_usual_commands(window):
    assert _by_shortcut(window, QKeySequence(QKeySequence.StandardKey.Open).toString()) == ["Open…"]
    assert _by_shortcut(window, "Ctrl+S") == ["Save session"]
    assert _by_shortcut(window, "Ctrl+Shift+S") == ["Save session as…"]
    assert _by_shortcut(window, "Ctrl+Q") == ["Quit"]
    assert _by_shortcut(window, "F1") == ["Keyboard shortcuts"]
    assert _by_shortcut(window, "Ctrl+Shift+W") == []  # the old, unusual save-session key


def test_the_file_menu_opens_first_saves_then_exports_and_quits_last(window):
    names = [plain(a.text()) for a in _menu(window, "File").actions() if not a.isSeparator()]
    assert names[0] == "Open…" and names[-1] == "Quit"
    order = ["Open…", "Open ROI…", "Save ROI…", "Open recent", "Save session", "Save session as…", "Export report…"]
    assert [names.index(name) for name in order] == sorted(names.index(name) for name in order)


def test_help_lists_every_shortcut_from_the_actions_themselves(window):
    assert [plain(a.text()) for a in window.menuBar().actions()][-1] == "Help"
    assert [plain(a.text()) for a in _menu(window, "Help").actions()] == ["Keyboard shortcuts", "About TractLens"]
    rows = shortcut_rows(window)
    with_keys = [a for _, a in window_actions(window) if not a.shortcut().isEmpty()]
    assert len(rows) == len(with_keys) >= 20
    assert ("File", "Save session", "Ctrl+S") in rows
    assert ("Edit", "Undo", "Ctrl+Z") in rows
    # a new action shows up without anyone editing a list
    from tractlens.widgets.controllers.menus import add_action

    add_action(window, _menu(window, "Analysis"), "Tract statistics", lambda: None, "Ctrl+Alt+T")
    assert ("Analysis", "Tract statistics", "Ctrl+Alt+T") in shortcut_rows(window)
    assert "Tract statistics" in shortcuts_html(window)


def test_help_boxes_are_not_shown_in_a_scripted_run(window, qtbot):
    from PySide6.QtWidgets import QApplication

    for action in _menu(window, "Help").actions():
        action.trigger()
        qtbot.wait(20)
        assert QApplication.activeModalWidget() is None


def test_save_session_asks_once_then_saves_to_the_same_file(window, qtbot, tmp_path):
    window.document.add_layer(_scalar_layer())
    target = tmp_path / "case.tractlens"
    with dialogs.answers(save_file=[str(target)]):
        QAction_named(window, "Save session").trigger()
    assert window.wait_for_jobs(30) and window.errors == []
    first = target.stat().st_mtime_ns
    qtbot.wait(20)
    QAction_named(window, "Save session").trigger()  # no dialog queued: it must not ask
    assert window.wait_for_jobs(30) and window.errors == []
    assert target.stat().st_mtime_ns > first
    other = tmp_path / "other.tractlens"
    with dialogs.answers(save_file=[str(other)]):
        QAction_named(window, "Save session as…").trigger()
    assert window.wait_for_jobs(30) and other.exists()


def QAction_named(window, text):
    return next(a for _, a in window_actions(window) if plain(a.text()) == text)


def _scalar_layer():
    import numpy as np

    from tractlens.app.model import Layer, Volume

    return Layer("FA", Volume("FA", np.ones((6, 6, 4), np.float32), np.eye(4)), "scalar")


# ------------------------------------------------------------------ gradient files in the window
@pytest.fixture
def bare_dwi(demo_dir, tmp_path):
    shutil.copy(demo_dir / "dwi.nii.gz", tmp_path / "scan.nii.gz")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for suffix in ("bval", "bvec"):
        shutil.copy(demo_dir / f"dwi.{suffix}", elsewhere / f"scan.{suffix}")
    return tmp_path / "scan.nii.gz", elsewhere / "scan.bval", elsewhere / "scan.bvec"


def test_a_dwi_without_gradients_asks_for_them_in_file_dialogs(window, bare_dwi):
    dwi, bval, bvec = bare_dwi
    with dialogs.answers(open_files=[[str(dwi)]], open_file=[str(bval), str(bvec)]):
        QAction_named(window, "Open…").trigger()
    assert window.wait_for_jobs(120)
    assert window.errors == []
    assert [layer.kind for layer in window.document.layers].count("dwi") == 1
    assert "FA" in [layer.name for layer in window.document.layers]


def test_a_scripted_run_without_gradient_answers_says_why_at_once(window, bare_dwi):
    dwi, _, _ = bare_dwi
    window.open_paths([dwi])  # nothing queued, no dialogs: refused at once, never waiting
    assert window.wait_for_jobs(5)
    assert window.document.layers == []
    assert len(window.errors) == 1 and "--bval FILE --bvec FILE" in window.errors[0]


def test_mismatched_gradients_are_refused_and_lose_nothing(window, bare_dwi, tmp_path):
    dwi, bval, bvec = bare_dwi
    window.document.add_layer(_scalar_layer())
    before = list(window.document.layers)
    short = tmp_path / "short.bval"
    short.write_text(" ".join(bval.read_text().split()[:-1]) + "\n")
    with dialogs.answers(open_file=[str(short), str(bvec)]):
        window.open_paths([dwi])
    assert window.wait_for_jobs(60)
    assert window.document.layers == before
    assert len(window.errors) == 1 and "b-values for" in window.errors[0] and "volumes" in window.errors[0]


def test_view_takes_bval_and_bvec_on_the_command_line(qtbot, bare_dwi, capsys):
    from tractlens.widgets.launcher import main

    dwi, bval, bvec = bare_dwi
    assert main(["view", str(dwi), "--bval", str(bval), "--bvec", str(bvec), "--device", "cpu", "--exit"]) == 0
    assert main(["view", str(dwi), "--device", "cpu", "--exit"]) == 2
    assert "--bval FILE --bvec FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["view", str(dwi), "--bval", str(bval), "--exit"])  # --bvec missing


# ------------------------------------------------------------------- long jobs announced first
def test_a_long_ball_and_sticks_fit_is_announced_before_it_starts(demo_window, qtbot, monkeypatch):
    from tractlens.app import estimates

    window = demo_window
    monkeypatch.setattr(estimates, "ANNOUNCE_S", 0.0)  # the demo's brain counts as a long job
    dwi = next(layer for layer in window.document.layers if layer.kind == "dwi")
    dialog = window.fit_ballstick_dialog(dwi)
    estimate = dialog.estimate()
    assert estimate.long and estimate.text.startswith("about ")
    assert dialog.estimate_label.text() == f"Expected: {estimate.text}"
    dialog.burnin.setValue(1)
    dialog.njumps.setValue(2)
    dialog.sample_every.setValue(1)
    with dialogs.answers(question=[False]):  # the user says no: nothing starts, the dialog stays
        dialog.accept()
    assert dialog.isVisible() and "Not started" in dialog.message.text()
    assert not window.runner.active()
    dialog.accept()  # scripted: proceeds, with the estimate where the job shows
    names = [job.name for job in window.runner.jobs.values()]
    assert any(name.startswith("ball & sticks") and "on the CPU" in name for name in names)
    assert "on the CPU" in window.statusBar().currentMessage()
    window.runner.cancel_all()
    assert window.wait_for_jobs(60)


def test_the_shortcut_list_fits_an_800_px_screen_and_includes_the_mouse(window, qtbot):
    from tractlens.widgets.controllers.help import ShortcutsDialog

    dialog = ShortcutsDialog(window)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.grab().save(str(ARTIFACTS / "shortcuts_dialog.png"))
    assert dialog.height() <= 740  # an 800 px screen less its panel and title bar
    assert not dialog.area.verticalScrollBar().isVisible()  # and nothing hidden below
    text = dialog.plain_text()
    for gesture in ("Wheel", "Right-drag", "Space+drag", "Ctrl+wheel"):
        assert gesture in text, gesture
