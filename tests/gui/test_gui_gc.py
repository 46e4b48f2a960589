"""While a window is open, Python's cyclic garbage is collected on the GUI thread only
(widgets/gui_gc.py): a collection on a pool thread could destroy Qt wrappers the GUI thread uses."""

from __future__ import annotations

import gc
import threading

from tractlens.widgets import gui_gc


class _Cycle:
    def __init__(self):
        self.me = self


def test_a_worker_thread_collects_nothing_while_a_window_is_open_and_the_gui_thread_does(window, qtbot):
    assert gui_gc.holding() and not gc.isenabled()
    collected_on: list[str] = []

    def note(phase, info):
        if phase == "start":
            collected_on.append(threading.current_thread().name)

    gc.callbacks.append(note)
    try:

        def churn():  # far past generation 0's threshold: Python's collector would run here
            for _ in range(20 * gc.get_threshold()[0]):
                _Cycle()

        worker = threading.Thread(target=churn, name="pool-like worker")
        worker.start()
        worker.join()
        assert "pool-like worker" not in collected_on
        qtbot.waitUntil(lambda: threading.main_thread().name in collected_on, timeout=5000)
    finally:
        gc.callbacks.remove(note)


def test_closing_the_last_window_gives_collection_back(window, qtbot):
    assert not gc.isenabled()
    window.close()
    assert gc.isenabled() and not gui_gc.holding()


def test_what_exists_once_the_window_is_up_is_kept_out_of_full_collections(window, qtbot):
    """The modules and the window's widgets are frozen out of the collector once the window is
    up (a full collection walked some 270 k objects, 60-150 ms on the GUI thread); closing the last
    window unfreezes them."""
    qtbot.waitUntil(lambda: gc.get_freeze_count() > 0, timeout=5000)
    frozen = gc.get_freeze_count()
    assert frozen > 50_000 and len(gc.get_objects()) < frozen  # a full collection now walks the rest only
    window.close()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
