"""A layer's "Save as…": asks for a file and runs :func:`app.layer_files.save_layer` on a worker
(a large tractogram takes seconds to write). The formats and the writing are the use case's; this
only asks, tells and confirms a replacement."""

from __future__ import annotations

import os
from pathlib import Path

from tractlens.app.layer_files import FORMAT_NAMES, default_file_name, layer_file_path, save_layer, save_suffixes

from .. import dialogs


def file_filter(layer) -> str:
    """``TrackVis (*.trk);;MRtrix (*.tck);;TRX (*.trx)`` or ``NIfTI (*.nii.gz *.nii)``."""
    groups: dict[str, list[str]] = {}
    for suffix in save_suffixes(layer):
        groups.setdefault(FORMAT_NAMES[suffix], []).append(f"*{suffix}")
    return ";;".join(f"{name} ({' '.join(patterns)})" for name, patterns in groups.items())


def _replace(window, path: Path) -> bool:
    return dialogs.question(window, "Replace file?", f"{path} already exists. Replace it?", default=False)


def save_layer_dialog(window, layer) -> int | None:
    """Ask where to write ``layer`` and write it there (the job id; None: nothing started)."""
    if not save_suffixes(layer):
        window.report_error(f"{layer.name} ({layer.kind}) is kept only in sessions: use File ▸ Save session.", "")
        return None
    path = dialogs.save_file(
        window, f"Save {layer.name} as", default_file_name(layer), file_filter(layer), confirm_overwrite=False
    )
    return save_layer_as(window, layer, path) if path else None


def save_layer_as(window, layer, path: str | os.PathLike, *, overwrite: bool = False) -> int | None:
    """Write ``layer`` to ``path`` on a worker; an existing file is replaced only when the user
    says so (or ``overwrite``). The job id, or None when nothing was started."""
    target = layer_file_path(layer, path)
    if target.exists() and not overwrite and not _replace(window, target):
        window.statusBar().showMessage(f"{layer.name} not saved: {target.name} exists and was not replaced", 15000)
        return None

    def done(written: Path) -> None:
        window.statusBar().showMessage(f"{layer.name} saved to {written}", 10000)

    def failed(message: str, details: str) -> None:
        window.report_error(f"{layer.name} was not saved: {message}", details)

    def job(_ctx):
        return save_layer(layer, target)

    return window.runner.submit(f"save {layer.name}", job, on_done=done, on_error=failed)
