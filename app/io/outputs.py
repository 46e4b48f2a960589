"""Checks on output paths, made before a long computation so that it is not lost at the end.

Nothing is created: a probe folder is made and removed where the output would go, which
catches what permission bits miss (read-only or virtual file systems, running as root).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import InputError
from ._atomic import _REASONS, check_replaceable_folder

__all__ = ["check_output_file", "check_output_folder", "check_replaceable_folder"]


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def _probe(folder: Path, target: Path, what: str) -> None:
    """Raise :class:`InputError` unless a folder can be created (and removed) in ``folder``."""
    try:
        probe = tempfile.mkdtemp(prefix=".tractlens-probe-", dir=folder)
    except OSError as exc:
        reason = _REASONS.get(exc.errno, exc.strerror or str(exc))
        raise InputError(
            f"the {what} cannot be written: {reason} (in {folder})",
            path=target,
            fix="Choose another output location (-o) where you can write",
        ) from None
    os.rmdir(probe)


def check_output_folder(path: str | os.PathLike, what: str = "output folder") -> Path:
    """An output folder that exists, or can be created, and can be written into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(
            f"the {what} exists and is a file, not a folder",
            path=path,
            fix="Give a folder name (it is created if missing), or move the file away",
        )
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise InputError(
            f"the {what} cannot be created: {existing} is a file, not a folder",
            path=path,
            fix="Choose another output folder (-o)",
        )
    _probe(existing, path, what)
    return path


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """An output file whose folder exists and can be written into (the file itself is replaced)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"the {what} is a folder, not a file", path=path, fix="Give a file name (-o)")
    if not path.parent.is_dir():
        raise InputError(
            f"the output folder does not exist (for the {what} {path.name})",
            path=path.parent,
            fix="Create it or choose another output path (-o)",
        )
    _probe(path.parent, path, what)
    return path
