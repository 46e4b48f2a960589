"""The main window's controllers: each owns one use case of the window (opening files, ROI files,
the fibre selection by ROIs, sessions and autosave, reports and screenshots) so that
:class:`~tractlens.widgets.main_window.MainWindow` only builds the widgets and wires them up.

Controllers that need no widget (:class:`FileController`, :class:`RoiController`,
:class:`FibreSelection`, :class:`SessionController`) hold none: they talk to the window through
Qt signals (``message``, ``error``) and callables given to them, and run without a screen.
"""

from .files import FileController
from .reports import ReportController
from .rois import RoiController
from .selection import FibreSelection
from .sessions import SessionController
from .settings import settings

__all__ = ["FibreSelection", "FileController", "ReportController", "RoiController", "SessionController", "settings"]
