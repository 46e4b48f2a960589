import gc

import pytest


@pytest.fixture(autouse=True)
def _gui_environment(tmp_path, monkeypatch):
    from tractlens.widgets import dialogs

    monkeypatch.setenv("TRACTLENS_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("TRACTLENS_NO_DIALOGS", "1")
    yield
    dialogs.set_scripted(False)  # open_window() marks the process scripted: not for the next test


@pytest.fixture
def window_device() -> str:
    """The compute device of :func:`window`: the CPU; a test parametrises it to run on the GPU."""
    return "cpu"


@pytest.fixture
def window(qtbot, window_device):
    from tractlens.widgets.main_window import MainWindow

    win = MainWindow(device=window_device)
    qtbot.addWidget(win)
    win.resize(1400, 900)
    win.show()
    qtbot.waitExposed(win)
    yield win
    win.runner.shutdown(10)
    # Close (which finalises the VTK render window) and collect now, while the X connection and the
    # GL context are in a known state, rather than leaving VTK objects in cycles for a later,
    # arbitrary garbage collection to destroy.
    win.close()
    qtbot.wait(1)
    gc.collect()


@pytest.fixture
def demo_window(window):
    window.open_demo()
    assert window.wait_for_jobs(120)
    assert window.errors == []
    return window


@pytest.fixture
def runner(qtbot):
    """A job runner that is shut down (jobs cancelled, workers joined) before it is destroyed."""
    from tractlens.widgets.jobs import JobRunner

    job_runner = JobRunner()
    yield job_runner
    assert job_runner.shutdown(10)
