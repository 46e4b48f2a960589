"""Atomic, durable file writing: write beside the target, flush it to disk, then rename over it.

A crash, a power cut or a full disk therefore never leaves half a file under the real
name, and the previous file (if any) stays as it was until the new one is complete.
:func:`atomic_folder` does the same for an output folder of several files.
Failures to write become :class:`SaveError`, whose message says what happened (the disk
is full, no permission, ...) and that the previous file was kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError


class SaveError(InputError):
    """A file could not be written (disk full, no permission, read-only file system, ...).

    An :class:`InputError` so that every caller that shows input errors to the user shows
    this too: it names the file, the reason and what to do, never a traceback.
    """


_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than this file system (or the process's file-size limit) allows",
    errno.EACCES: "there is no permission to write there",
    errno.EPERM: "there is no permission to write there",
    errno.EROFS: "the file system is read-only",
}


def _free_space(folder: Path) -> str:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f" ({free / 2**20:.0f} MiB free there)"


def save_error(exc: OSError, target: Path) -> SaveError:
    """The user-facing error for an :class:`OSError` raised while writing ``target``."""
    reason = _REASONS.get(exc.errno, exc.strerror or str(exc))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += _free_space(target.parent)
    kept = "the previous file was left as it was" if target.exists() else "nothing was written"
    return SaveError(
        f"could not be saved: {reason}; {kept}",
        path=target,
        fix="Free some space or choose another folder, then save again",
    )


def split_suffix(path: Path) -> tuple[str, str]:
    """``brain.nii.gz`` -> (``brain``, ``.nii.gz``); format libraries read the suffix."""
    name = path.name
    for double in (".nii.gz", ".tar.gz"):
        if name.lower().endswith(double):
            return name[: -len(double)], name[-len(double) :]
    return path.stem, path.suffix


def fsync_path(path: Path) -> None:
    """Flush a file (or every file and folder under a folder, and the folder) to the disk."""
    if path.is_dir():
        for item in path.rglob("*"):
            if item.is_file():
                _fsync_fd(item, os.O_RDONLY)
            elif item.is_dir():  # its entries (the names of the files flushed above)
                _fsync_fd(item, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        _fsync_fd(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    else:
        _fsync_fd(path, os.O_RDONLY)


def _fsync_fd(path: Path, flags: int) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. folders cannot be opened on Windows: nothing to flush there
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # file systems without fsync on folders
            raise
    finally:
        os.close(fd)


_deferred = 0
_deferred_lock = threading.Lock()


@contextlib.contextmanager
def durability_deferred() -> Iterator[None]:
    """Within this block, in this process and all its threads, atomic writes skip their flushes
    to the disk (their renames stay atomic) and streamed files start no early write-back: the
    caller makes the files durable itself, later.

    A batch runs each step's command inside it and flushes the step's outputs on a thread of
    its own before it writes their sidecars, the record that a step is done (a power cut
    before that leaves a step the next run redoes). The command's wait for the disk then
    overlaps the next step's work instead of adding to it. Not for a single command: its files
    are durable when it returns."""
    global _deferred
    with _deferred_lock:
        _deferred += 1
    try:
        yield
    finally:
        with _deferred_lock:
            _deferred -= 1


def durability_is_deferred() -> bool:
    """Whether :func:`durability_deferred` is in force in this process."""
    return _deferred > 0


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool | None = None) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it to ``path`` on success.

    The temporary name keeps the target's suffix so writers that choose the
    format (or compression) from the file name behave the same. With ``durable`` (by default,
    unless :func:`durability_deferred` is in force) the new file is flushed to the disk before
    the rename, and the folder after it, so that even a power cut leaves the old or the new
    file, never a mix. An :class:`OSError` while writing (disk full, no permission) becomes
    :class:`SaveError`; the temporary file is removed and the previous file is untouched.
    """
    target = Path(path)
    if durable is None:
        durable = not durability_is_deferred()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise save_error(exc, target) from exc
    stem, suffix = split_suffix(target)
    tmp = target.with_name(f".{stem}.tmp-{secrets.token_hex(4)}{suffix}")
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, target)
        if durable:
            _fsync_fd(target.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise save_error(exc, target) from exc
    finally:
        with contextlib.suppress(OSError):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.exists():
                tmp.unlink()


def check_replaceable_folder(
    path: str | os.PathLike, marker: str, what: str, inputs: tuple = (), templates: tuple = ()
) -> Path:
    """``path`` as an absolute folder that :func:`atomic_folder` may replace: missing, empty, or an
    earlier output of the same kind (it holds ``marker``) holding only what that output wrote (the
    marker's ``files`` list, else the names ``templates`` make), none of ``inputs``, and not the
    current folder or one above it. Anything else is refused: replacing it would delete the
    user's other files."""
    folder = Path(os.path.abspath(path))
    if folder.parent == folder:
        raise InputError(f"is not a folder the {what} can be written to", path=folder, fix="Give a folder for -o")
    if folder.exists() and not folder.is_dir():
        raise InputError("exists and is not a folder", path=folder, fix="Give a new folder name for -o")
    if not folder.is_dir() or not any(folder.iterdir()):
        return folder
    if not (folder / marker).is_file():
        raise InputError(
            f"is a folder that holds other files (not an earlier {what}, which has {marker}); the {what} "
            "replaces its folder whole",
            path=folder,
            fix="Give a new or empty folder for -o; an earlier output of this command is replaced",
        )
    listed = _listed_files(folder / marker)
    names = sorted(p.name for p in folder.iterdir() if p.name != marker)
    if listed is not None:  # the earlier output's record names its files
        extra = [name for name in names if name not in listed]
    elif templates:  # else the names its command writes
        pattern = names_matching(templates)
        extra = [name for name in names if not pattern.match(name)]
    else:  # nothing to tell them by: every file is taken for the earlier output's
        extra = []
    if extra:
        raise InputError(
            f"holds files that the earlier {what} did not write ({', '.join(extra[:3])}"
            + (", ..." if len(extra) > 3 else "")
            + f"); the {what} replaces its folder whole",
            path=folder,
            fix="Move those files away, or give another folder for -o",
        )
    cwd = Path.cwd().resolve()
    resolved = folder.resolve()
    if cwd == resolved or resolved in cwd.parents:
        raise InputError(
            f"is the current folder or holds it; the {what} replaces its folder whole",
            path=folder,
            fix="Give the folder's name from outside it, or another folder for -o",
        )
    for source in inputs:
        where = Path(os.path.abspath(source)).resolve() if source is not None else None
        if where is not None and (where == resolved or resolved in where.parents):
            raise InputError(
                f"is or holds the input {Path(source).name}; the {what} replaces its folder whole",
                path=folder,
                fix="Give another folder for -o",
            )
    return folder


def names_matching(templates) -> re.Pattern:
    """A pattern of the file names that ``templates`` make: ``{i}`` a number, any other ``{...}``
    any text (``dyads{i}.nii.gz``, ``seeds_to_{target}.nii.gz``)."""
    parts = []
    for template in templates:
        pieces = re.split(r"(\{[^}]*\})", template)
        parts.append("".join(r"\d+" if p == "{i}" else ".+" if p.startswith("{") else re.escape(p) for p in pieces))
    return re.compile("^(?:" + "|".join(parts) + ")$")


def _listed_files(marker: Path) -> set[str] | None:
    """The files an earlier output's record says it wrote (its ``files`` list), if it has one."""
    try:
        files = json.loads(marker.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return {str(f) for f in files} if isinstance(files, list) else None


@contextlib.contextmanager
def atomic_folder(
    path: str | os.PathLike, marker: str, what: str, inputs: tuple = (), templates: tuple = ()
) -> Iterator[Path]:
    """Yield an empty staging folder beside ``path`` (``.NAME.partial``); on success it replaces
    ``path`` (a previous folder of that name is removed only once the new one is in place). Only a
    folder :func:`check_replaceable_folder` allows is replaced (checked again here, at the end).

    Any exception inside the block, a cancel included, removes the staging folder and leaves a
    previous ``path`` as it was; a staging folder left by a killed earlier run is cleared first.
    """
    folder = check_replaceable_folder(path, marker, what, inputs, templates)
    staging = folder.with_name(f".{folder.name}.partial")
    previous = folder.with_name(f".{folder.name}.previous")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        check_replaceable_folder(folder, marker, what, inputs, templates)  # (the folder may have changed meanwhile)
        shutil.rmtree(previous, ignore_errors=True)
        if folder.exists():
            folder.rename(previous)
        try:
            staging.rename(folder)
        except BaseException:
            if previous.exists() and not folder.exists():
                previous.rename(folder)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def write_text_atomic(text: str, path: str | os.PathLike, *, durable: bool | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path` (``durable`` as there)."""
    path = Path(path)
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
