"""Atomic file writing: write beside the target, then rename over it.

A crash or a full disk therefore never leaves half a file under the real name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def split_suffix(path: Path) -> tuple[str, str]:
    """``brain.nii.gz`` -> (``brain``, ``.nii.gz``); format libraries read the suffix."""
    name = path.name
    for double in (".nii.gz", ".tar.gz"):
        if name.lower().endswith(double):
            return name[: -len(double)], name[-len(double) :]
    return path.stem, path.suffix


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it to ``path`` on success.

    The temporary name keeps the target's suffix so writers that choose the
    format (or compression) from the file name behave the same.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    stem, suffix = split_suffix(target)
    tmp = target.with_name(f".{stem}.tmp-{secrets.token_hex(4)}{suffix}")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path`."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
