"""A command's output files put into a folder as one set: all of this run's, or none of them.

A fit writes a dozen maps and a record into a folder that may hold an earlier fit's. Written one
by one, an interrupted run left some new maps beside old ones (the record saying something else),
and a run that writes fewer files (ball & sticks with fewer sticks, another microstructure model,
probabilistic tracking without targets) left the earlier run's extra files looking like its own:
a bedpostX folder of 1 stick then read as 2 sticks by probtrackx.

:func:`output_set` has the writer write into a hidden staging folder inside the output folder,
then moves every file into place (the record last) with Ctrl+C and SIGTERM held for those
milliseconds, and removes the files of the previous set that this one did not write. Which files
were the previous set's is read from the folder's manifest (``.NAME.files``, written with each
set), or, for a folder written before manifests, from the command's file-name templates: never a
file of the user's that is neither. A staging folder left by a killed run is removed by the next.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from ._atomic import _fsync_fd, durability_is_deferred, names_matching, save_error, write_text_atomic

__all__ = ["PARTIAL", "names_matching", "output_set"]

PARTIAL = ".tractlens-partial-"


#: A staging folder untouched this long is a killed run's: removed by the next run into the folder.
#: By age, not by process: a run on another host or in another container (a shared file system)
#: has a process this one cannot see, and its live folder must be left alone. Writing a set takes
#: seconds to minutes.
STALE_PARTIAL_S = 6 * 3600


def _clear_stale_partials(folder: Path) -> None:
    now = time.time()
    for stage in folder.glob(PARTIAL + "*"):
        try:
            if now - stage.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(stage, ignore_errors=True)
        except OSError:
            continue


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl+C and SIGTERM wait until the block is done (main thread only; elsewhere no signal
    handler runs Python code anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda number, frame: caught.append(number)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # (None: set outside Python)
        for number in caught[:1]:
            handler = previous[number]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL and number == signal.SIGINT:
                raise KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)


@contextlib.contextmanager
def output_set(
    folder: str | os.PathLike, record: str, templates: Iterable[str] = (), key: str | None = None
) -> Iterator[Path]:
    """Yield a staging folder to write the command's files in; on success they replace the
    folder's earlier set (see the module's docstring), ``record`` (the command's JSON summary)
    last. ``key`` names the set's manifest (default: the record's stem; fit-dti's includes its
    prefix, so fits of two prefixes in one folder are two sets). On an exception, Ctrl+C or a
    cancel inside the block the folder is left as it was."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError("the output path exists and is not a folder", path=folder,
                         fix="Give a folder name, or move the file away")  # fmt: skip
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _clear_stale_partials(folder)
        stage = folder / f"{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}"
        stage.mkdir()
    except OSError as exc:
        raise save_error(exc, folder) from None
    manifest = folder / f".{key or Path(record).stem}.files"
    try:
        yield stage
        written = sorted(p.name for p in stage.iterdir())
        earlier = _earlier_set(folder, manifest, record, templates)
        with _signals_held():  # a signal here waits until the set is in place and the stage gone
            for name in sorted(written, key=lambda n: n == record):  # the record last
                os.replace(stage / name, folder / name)
            for name in sorted(earlier - set(written)):
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            write_text_atomic("\n".join(written) + "\n", manifest)
            shutil.rmtree(stage, ignore_errors=True)
            if not durability_is_deferred():  # the renames on the disk (the files were flushed when written)
                _fsync_fd(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise save_error(exc, folder) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _earlier_set(folder: Path, manifest: Path, record: str, templates: Iterable[str]) -> set[str]:
    """The names the folder's previous set of this command wrote: its manifest, or, in a folder
    holding the command's record but no manifest (written by an earlier version), the files the
    templates name. A folder without the record never held the command's set: nothing of it is
    taken for one (a subject's own gm.nii.gz is not a CSD fit's)."""
    try:
        return {line for line in manifest.read_text().splitlines() if line and "/" not in line}
    except OSError:
        pass
    templates = tuple(templates)
    if not templates or not (folder / record).is_file():
        return set()
    pattern = names_matching(templates)
    return {p.name for p in folder.iterdir() if p.is_file() and pattern.match(p.name)}
