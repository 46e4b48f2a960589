"""Driving the main window from Python (scripts, tests, notebooks).

>>> from widgets.api import open_window
>>> window = open_window("sub-01_dwi.nii.gz", "wb.trx", device="cpu")
>>> window.document.set_cursor((40, 52, 30))
>>> window.set_camera_view("axial")
>>> window.save_screenshot("axial.png")

The window is a :class:`widgets.main_window.MainWindow`: ``document`` (the layers and the
cursor), ``views`` (the slice views), ``view3d``, :meth:`~MainWindow.open_paths`,
:meth:`~MainWindow.wait_for_jobs`, :meth:`~MainWindow.save_screenshot`,
:meth:`~MainWindow.set_fiber_slab`, :meth:`~MainWindow.maximise_view`... In a Jupyter
notebook run ``%gui qt`` first, so that the window stays responsive between cells.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from . import dialogs
from .main_window import MainWindow


def open_window(
    *paths: str | os.PathLike,
    demo: bool = False,
    device: str = "auto",
    size: tuple[int, int] = (1600, 1000),
    wait: bool = True,
    timeout_s: float = 600.0,
    autosave_s: float | None = 0,
    interactive: bool = False,
) -> MainWindow:
    """A shown main window (making the QApplication when there is none) with ``paths`` opened
    in that order (the first at the bottom of the layer stack) and, with ``demo``, the demo
    phantom. With ``wait`` it returns once everything is loaded and drawn
    (:meth:`MainWindow.wait_for_jobs`; a :class:`TimeoutError` after ``timeout_s``).
    ``autosave_s``: seconds between autosaves, 0 (the default here) for none. A script never
    waits for a click: unless ``interactive`` (a person will use the window, e.g. in a
    notebook), no dialog is shown (:mod:`widgets.dialogs`: each returns its scripted answer)
    and an earlier crash's autosave is kept for the next interactive start, with a line on
    stderr."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("TractLens")
    if not interactive:
        dialogs.set_scripted(True)
    window = MainWindow(device=device, autosave_s=autosave_s, restore="ask" if interactive else "no")
    window.resize(*size)
    window.show()
    if demo:
        window.open_demo()
        if paths and not window.wait_for_jobs(timeout_s):  # the demo's layers first
            raise TimeoutError(f"the demo did not load in {timeout_s:g} s")
    if paths:
        window.open_paths(_as_list(paths))
    if wait and not window.wait_for_jobs(timeout_s):
        raise TimeoutError(f"loading did not finish in {timeout_s:g} s")
    return window


def _as_list(paths: Iterable) -> list:
    return [os.fspath(path) for path in paths]
