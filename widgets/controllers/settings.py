"""Where the window keeps what it remembers between starts (layout, recent files, autosave interval)."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings


def settings() -> QSettings:
    """Application settings; ``TRACTLENS_CONFIG_DIR`` puts them elsewhere (tests, kiosks)."""
    folder = os.environ.get("TRACTLENS_CONFIG_DIR")
    if folder:
        return QSettings(str(Path(folder) / "tractlens.ini"), QSettings.Format.IniFormat)
    return QSettings("TractLens", "TractLens")
