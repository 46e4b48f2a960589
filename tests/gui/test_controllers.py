"""The main window's controllers that hold no widget, driven without a window: opening files, ROI
files, the fibre selection by ROIs (and its streamline index in document.derived), sessions and
the autosave. They need a Qt application for signals and the job runner's queued deliveries, but
no widget is made."""

import gc
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QObject, Signal

from tractlens.app.grid import Grid
from tractlens.app.io import save_volume
from tractlens.app.io.tractogram import save_tractogram
from tractlens.app.model import Document, Layer, RoiMask, Tractogram, Volume
from tractlens.app.selection import STREAMLINE_INDEX, RoiSelection, select_fibres, streamline_index
from tractlens.app.session import snapshot
from tractlens.widgets.jobs import JobRunner

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (20, 20, 10)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


@pytest.fixture(autouse=True)
def _config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CONFIG_DIR", str(tmp_path / "config"))
    yield
    # A controller and the document it observes form a reference cycle. Collect it here, on the
    # GUI thread: left to a later collection that happens to run on a job's worker thread, the
    # controller's QTimer would be deleted from the wrong thread and a later timer event would
    # touch freed memory (a segmentation fault in QTimerInfoList::activateTimers).
    gc.collect()


@pytest.fixture
def runner(qapp):
    job_runner = JobRunner()
    yield job_runner
    assert job_runner.shutdown(10)


def three_fibres() -> Tractogram:
    """Straight fibres along x at y = 5, 10, 15 (voxels), z = 5."""
    lines = [np.array([[x, y, 5.0] for x in range(2, 18)], np.float32) for y in (5, 10, 15)]
    return Tractogram.from_list(lines, affine=AFFINE, dimensions=SHAPE, name="fibres")


def document_with_fibres() -> tuple[Document, Layer]:
    doc = Document()
    doc.add_layer(Layer("FA", Volume("FA", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    tracts = doc.add_layer(Layer("fibres", three_fibres(), "tractogram", filter_by_rois=True))
    return doc, tracts


def add_roi(doc: Document, role: str, voxels) -> Layer:
    mask = np.zeros(SHAPE, dtype=bool)
    mask[tuple(np.asarray(voxels).T)] = True
    return doc.add_layer(Layer(f"{role} roi", RoiMask(f"{role} roi", mask, AFFINE, role=role), "roi"))


# ------------------------------------------------------------------ app.selection
def test_the_streamline_index_is_built_once_and_kept_by_the_document():
    doc, tracts = document_with_fibres()
    first = streamline_index(doc, tracts, AFFINE, "cpu")
    assert streamline_index(doc, tracts, AFFINE.copy(), "cpu") is first  # same grid: no rebuild
    assert doc.derived.peek(tracts.data, STREAMLINE_INDEX, (AFFINE.tobytes(), "cpu")) is first
    other_grid = np.diag([1.0, 1.0, 1.0, 1.0])
    assert streamline_index(doc, tracts, other_grid, "cpu") is not first
    # The tractogram leaves the document and is collected: what was derived from it goes too.
    doc.remove_layer(tracts)
    before = len(doc.derived)
    del tracts, first
    gc.collect()
    assert len(doc.derived) == before - 2


def test_the_rois_select_the_fibres_that_pass_them():
    doc, tracts = document_with_fibres()
    assert RoiSelection.of(doc) is None  # no ROI: nothing to select
    add_roi(doc, "seed", [(3, 5, 5), (3, 10, 5)])  # on the first two fibres
    exclusion = add_roi(doc, "exclusion", [(16, 10, 5)])  # on the second
    request = RoiSelection.of(doc)
    [(layer, selected)] = select_fibres(doc, request, device="cpu")
    assert layer is tracts and selected.tolist() == [True, False, False]
    # The request is a snapshot: later edits do not reach a selection already asked for.
    doc.paint(exclusion, np.array([[16, 5, 5]]), True)
    assert select_fibres(doc, request, device="cpu")[0][1].tolist() == [True, False, False]
    # Exclusion only: every fibre that avoids it.
    doc.remove_layer(doc.layer("seed roi"))
    assert select_fibres(doc, RoiSelection.of(doc), device="cpu")[0][1].tolist() == [False, False, True]


# --------------------------------------------------------------- FibreSelection
def test_the_fibre_selection_follows_roi_edits_through_a_throttle(qtbot, runner):
    from tractlens.widgets.controllers import FibreSelection

    doc, tracts = document_with_fibres()
    selection = FibreSelection(doc, runner, device="cpu")
    seed = add_roi(doc, "seed", [(8, 15, 5)])
    assert selection.timer.isActive()  # an ROI added: a selection is due
    qtbot.waitUntil(lambda: tracts.selection is not None, timeout=5000)
    assert tracts.selection.tolist() == [False, False, True]
    first = tracts.selection
    # An edit starts the throttle; a second edit does not restart it.
    doc.paint(seed, np.array([[8, 5, 5]]), True)
    remaining = selection.timer.remainingTime()
    doc.paint(seed, np.array([[9, 5, 5]]), True, merge_with_last=True)
    assert selection.timer.isActive() and selection.timer.remainingTime() <= remaining
    qtbot.waitUntil(lambda: tracts.selection is not first, timeout=5000)
    assert tracts.selection.tolist() == [True, False, True]
    # The ROI hidden: the selection the ROIs made is cleared.
    seed.set(visible=False)
    qtbot.waitUntil(lambda: tracts.selection is None, timeout=5000)


def test_a_single_roi_edit_is_selected_at_once_and_a_drag_at_the_throttles_pace(qtbot, runner, monkeypatch):
    from PySide6.QtWidgets import QApplication

    from tractlens.widgets.controllers import FibreSelection
    from tractlens.widgets.controllers import selection as selection_module

    monkeypatch.setattr(selection_module, "THROTTLE_MS", 300)  # (read when the controller is made)
    doc, tracts = document_with_fibres()
    controller = FibreSelection(doc, runner, device="cpu")
    seed = add_roi(doc, "seed", [(8, 15, 5)])
    qtbot.waitUntil(lambda: tracts.selection is not None and controller.job is None, timeout=5000)
    qtbot.waitUntil(lambda: not controller.timer.isActive(), timeout=5000)
    started = []
    submit = runner.submit
    monkeypatch.setattr(runner, "submit", lambda *a, **k: started.append(a[0]) or submit(*a, **k))
    # An edit with none before it for a while: its selection starts at the next turn of the event
    # loop, not when the throttle's timer ends.
    doc.paint(seed, np.array([[8, 5, 5]]), True)
    QApplication.processEvents()
    assert started == ["select streamlines"] and controller.timer.isActive()
    # More edits while the timer runs (a drag): one selection when it ends, of all of them.
    doc.paint(seed, np.array([[9, 5, 5]]), True, merge_with_last=True)
    doc.paint(seed, np.array([[10, 5, 5]]), True, merge_with_last=True)
    QApplication.processEvents()
    assert started == ["select streamlines"]
    qtbot.waitUntil(lambda: len(started) == 2, timeout=5000)
    qtbot.waitUntil(lambda: controller.job is None and not runner.active(), timeout=5000)
    assert tracts.selection.tolist() == [True, False, True]
    qtbot.wait(400)
    assert len(started) == 2  # nothing was left for a third


def test_a_selection_made_another_way_survives_unrelated_changes(qtbot, runner):
    from tractlens.widgets.controllers import FibreSelection

    doc, tracts = document_with_fibres()
    selection = FibreSelection(doc, runner, device="cpu")
    tracts.set_selection(np.array([False, True, False]))  # e.g. a connectivity cell
    doc.add_layer(Layer("MD", Volume("MD", np.ones(SHAPE, np.float32), AFFINE), "scalar"))
    assert selection.update() is None  # no ROIs: nothing to run
    assert tracts.selection.tolist() == [False, True, False]


# --------------------------------------------------------------- FileController
def test_files_of_one_call_stack_in_the_order_given(qtbot, runner, tmp_path):
    from tractlens.widgets.controllers import FileController

    fa = save_volume(np.random.default_rng(0).random(SHAPE).astype(np.float32), AFFINE, tmp_path / "fa.nii.gz")
    trk = save_tractogram(three_fibres(), tmp_path / "fibres.trk")
    doc = Document()
    files = FileController(doc, runner, device="cpu")
    loaded, errors = [], []
    files.loaded.connect(loaded.append)
    files.error.connect(lambda message, details: errors.append(message))
    files.open_paths([trk, tmp_path / "missing.nii.gz", fa])
    qtbot.waitUntil(lambda: len(loaded) == 2 and not runner.active(), timeout=30000)
    assert [layer.name for layer in doc.layers] == ["fibres", "fa"]  # the first at the bottom
    assert loaded == [trk, fa] and len(errors) == 1 and "missing.nii.gz" in errors[0]
    assert len(doc.layers[0].data) == 3


def test_a_session_path_among_the_files_opens_as_a_session(runner, tmp_path):
    from tractlens.widgets.controllers import FileController

    asked = []
    files = FileController(Document(), runner, open_session=asked.append)
    assert files.open_paths([tmp_path / "work.tractlens"]) == []
    assert asked == [tmp_path / "work.tractlens"]


# ---------------------------------------------------------------- RoiController
def test_an_roi_file_is_opened_onto_the_document_grid_as_an_undoable_edit(qapp, tmp_path):
    from tractlens.widgets.controllers import RoiController

    doc, _ = document_with_fibres()
    fine = np.zeros((40, 40, 20), np.uint8)
    fine[10, 10, 4] = 1
    path = save_volume(fine, np.eye(4), tmp_path / "seed.nii.gz")
    rois = RoiController(doc, role=lambda: "waypoint")
    messages, errors = [], []
    rois.message.connect(lambda text, ms: messages.append(text))
    rois.error.connect(lambda text, details: errors.append(text))
    layer = rois.open_roi(path)
    assert layer.kind == "roi" and layer.data.role == "waypoint" and layer.name == "seed"
    assert Grid.of(layer.data).matches(Grid(AFFINE, SHAPE))
    assert {tuple(v) for v in np.argwhere(layer.data.mask)} == {(5, 5, 2)}
    assert "another grid" in messages[-1] and errors == []
    assert rois.open_roi(path, role="target").name == "seed (2)"
    assert doc.undo() and [lay.name for lay in doc.layers if lay.kind == "roi"] == ["seed"]
    outside = save_volume(
        np.ones((4, 4, 4), np.uint8), np.diag([1, 1, 1, 1.0]) + np.eye(4, k=3) * 900, tmp_path / "far.nii"
    )
    assert rois.open_roi(outside) is None and "outside the image" in errors[-1]


def test_an_roi_is_saved_and_a_file_replaced_only_when_the_user_agrees(qapp, tmp_path):
    from tractlens.widgets.controllers import RoiController

    doc, _ = document_with_fibres()
    roi = add_roi(doc, "seed", [(1, 2, 3)])
    answers = []
    rois = RoiController(doc, ask_overwrite=lambda path: answers.pop(0))
    written = rois.save_roi(roi, tmp_path / "seed")
    assert written == tmp_path / "seed.nii.gz" and written.exists()
    answers.append(False)
    assert rois.save_roi(roi, written) is None and answers == []
    answers.append(True)
    assert rois.save_roi(roi, written) == written


# ------------------------------------------------------------ SessionController
class Host(QObject):
    """What WindowAutosave needs of a window, without a window: a document."""

    def __init__(self, document):
        super().__init__()
        self.document = document


class FakeAutosave(QObject):
    saved = Signal()
    failed = Signal(str)

    def __init__(self, interval_s):
        super().__init__()
        self.interval_s, self.saves, self.closed = interval_s, 0, False

    def set_interval(self, seconds):
        self.interval_s = seconds

    def save_now(self):
        self.saves += 1
        return True

    def close(self):
        self.closed = True


def test_a_session_is_saved_and_opened_on_workers(qtbot, runner, tmp_path):
    from tractlens.widgets.controllers import SessionController

    doc, _ = document_with_fibres()
    add_roi(doc, "seed", [(4, 4, 4)])
    applied, opened = [], []
    sessions = SessionController(runner, snapshot=lambda: snapshot(doc), apply=applied.append)
    sessions.opened.connect(opened.append)
    sessions.save_session(tmp_path / "work")
    assert runner.wait(30)
    qtbot.waitUntil(lambda: (tmp_path / "work.tractlens").exists(), timeout=5000)
    sessions.open_session(tmp_path / "work.tractlens")
    qtbot.waitUntil(lambda: len(applied) == 1, timeout=30000)
    assert [layer.name for layer in applied[0].document.layers] == ["FA", "fibres", "seed roi"]
    assert opened == [tmp_path / "work.tractlens"]


def test_the_autosave_interval_is_remembered_and_failures_are_said_once(qapp, runner):
    from tractlens.widgets.controllers import SessionController

    made, errors = [], []

    def make(interval_s):
        made.append(FakeAutosave(interval_s))
        return made[-1]

    sessions = SessionController(runner, snapshot=lambda: None, apply=lambda s: None, make_autosave=make)
    sessions.error.connect(lambda text, details: errors.append(text))
    sessions.start_autosave()  # the saved setting, else 30 s
    assert made[0].interval_s == 30.0
    sessions.set_autosave_interval(12)
    assert made[0].interval_s == 12
    sessions.start_autosave()
    assert made[1].interval_s == 12.0  # remembered
    made[1].failed.emit("disk full")
    made[1].failed.emit("disk full")
    assert errors == ["Autosave failed (it is tried again): disk full"]
    sessions.close()
    assert made[1].closed and sessions.autosave is None


def test_a_restored_autosave_is_deleted_once_the_window_autosaved_again(qtbot, runner, tmp_path):
    from tractlens.app.recovery import find_orphans
    from tractlens.widgets.controllers import SessionController
    from tractlens.widgets.session_io import WindowAutosave

    # A window that crashed: its autosave written, its lock dropped without cleaning up.
    crashed_doc, _ = document_with_fibres()
    crashed_host = Host(crashed_doc)  # the autosave's parent: kept alive
    crashed = WindowAutosave(crashed_host, 0)
    assert crashed.save_now() and crashed.saver.wait(30)
    crashed.store._lock.release()
    [orphan] = find_orphans()

    doc = Document()
    host = Host(doc)
    messages = []
    sessions = SessionController(
        runner,
        snapshot=lambda: snapshot(doc),
        apply=lambda session: [doc.add_layer(layer) for layer in list(session.document.layers)],
        make_autosave=lambda interval_s: WindowAutosave(host, interval_s),
    )
    sessions.message.connect(lambda text, ms: messages.append(text))
    sessions.start_autosave(0)
    sessions.restore_autosave(orphan)
    qtbot.waitUntil(
        lambda: bool(messages) and messages[-1].startswith("Restored") and sessions.restoring is None, timeout=30000
    )
    assert [layer.name for layer in doc.layers] == ["FA", "fibres"]
    assert not orphan.folder.exists()  # the restored work is in this window's own autosave now
    sessions.close()


# ------------------------------------------------------------------ the shell's lanes
SHELL_MODULES = [
    "widgets/main_window.py",
    "widgets/view3d.py",
    "widgets/shape_handles.py",
    "widgets/fiber_actors.py",
    *sorted(f"widgets/controllers/{p.name}" for p in (ROOT / "widgets" / "controllers").glob("*.py")),
]
SPLIT_MODULES = ["app/model.py", "app/observable.py", "app/volumes.py", "app/tractogram.py", "app/layers.py"]
SPLIT_MODULES += ["app/document.py", "app/loaders.py", "app/selection.py"]


@pytest.mark.parametrize("module", SHELL_MODULES)
def test_the_window_reaches_the_engine_only_through_app_and_no_private_module(module):
    from tests.test_architecture import imported_modules

    bad = [
        name
        for name in imported_modules(ROOT / module)
        if name.startswith("tractlens.gpu") or (name.startswith("tractlens.app") and "._" in name)
    ]
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", SHELL_MODULES + SPLIT_MODULES)
def test_no_module_of_the_shell_or_the_model_is_a_god_module(module):
    text = (ROOT / module).read_text()
    assert len(text.splitlines()) <= 600
    assert text.lstrip().startswith('"""'), f"{module} says what it is for"
