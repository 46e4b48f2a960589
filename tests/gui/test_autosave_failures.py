"""Issue 22, defect 1: after probabilistic tracking every autosave failed and crash recovery
stopped without a lasting word. The autosave must write an integer "probabilistic paths" layer,
and a failing autosave must keep one status line up until the next autosave, tried at the next
tick, succeeds."""

import gc

import numpy as np
import pytest
from PySide6.QtCore import QObject

from tractlens.app.model import Document, Layer, Volume
from tractlens.app.session import load_session, snapshot
from tractlens.widgets.jobs import JobRunner

SHAPE = (8, 7, 6)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


class Host(QObject):
    """What WindowAutosave needs of a window: a document."""

    def __init__(self, document):
        super().__init__()
        self.document = document


@pytest.fixture
def runner(qtbot):
    job_runner = JobRunner()
    yield job_runner
    assert job_runner.shutdown(10)
    gc.collect()


def paths_document() -> Document:
    doc = Document()
    doc.add_layer(Layer("FA", Volume("FA", np.linspace(0, 1, np.prod(SHAPE)).reshape(SHAPE), AFFINE), "scalar"))
    counts = np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE) * 1000
    doc.add_layer(Layer("probabilistic paths", Volume("probabilistic paths", counts, AFFINE), "scalar"))
    return doc


def test_autosave_writes_a_probabilistic_paths_layer_and_a_failure_stays_said_until_it_works(
    qtbot, runner, monkeypatch
):
    from tractlens.app import session as session_module
    from tractlens.widgets.controllers import SessionController
    from tractlens.widgets.session_io import WindowAutosave

    doc = paths_document()
    host = Host(doc)
    messages, errors = [], []
    sessions = SessionController(
        runner,
        snapshot=lambda: snapshot(doc),
        apply=lambda session: None,
        make_autosave=lambda interval_s: WindowAutosave(host, interval_s),
    )
    sessions.message.connect(lambda text, ms: messages.append((text, ms)))
    sessions.error.connect(lambda text, details: errors.append(text))
    sessions.start_autosave(0)
    saver = sessions.autosave.saver

    real_save_volume = session_module.save_volume

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_module, "save_volume", full_disk)
    for _ in range(2):  # two failing ticks: one error box, the status line renewed each time
        assert sessions.autosave.save_now() and saver.wait(30)
        qtbot.waitUntil(lambda: bool(messages) and messages[-1][1] == 0, timeout=5000)
        messages.clear()
    assert len(errors) == 1 and "No space left" in errors[0]
    assert saver.writes == 0

    monkeypatch.setattr(session_module, "save_volume", real_save_volume)
    assert sessions.autosave.save_now() and saver.wait(30)  # the next tick tries again
    qtbot.waitUntil(lambda: bool(messages), timeout=5000)
    assert messages[-1][0].startswith("Autosaved again") and messages[-1][1] > 0
    assert saver.writes == 1
    restored = load_session(sessions.autosave.store.folder).document
    paths = restored.layer("probabilistic paths").data.data
    assert paths.dtype == np.int64
    np.testing.assert_array_equal(paths, doc.layer("probabilistic paths").data.data)
    sessions.close()
