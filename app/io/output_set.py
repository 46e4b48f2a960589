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
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from ._atomic import _fsync_fd, durability_is_deferred, save_error, write_text_atomic

PARTIAL = ".tractlens-partial-"


def names_matching(templates: Iterable[str]) -> re.Pattern:
    """A pattern of the file names that ``templates`` make: ``{i}`` a number, any other ``{...}``
    any text (``dyads{i}.nii.gz``, ``seeds_to_{target}.nii.gz``)."""
    parts = []
    for template in templates:
        pieces = re.split(r"(\{[^}]*\})", template)
        parts.append("".join(r"\d+" if p == "{i}" else ".+" if p.startswith("{") else re.escape(p) for p in pieces))
    return re.compile("^(?:" + "|".join(parts) + ")$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _clear_dead_partials(folder: Path) -> None:
    for stage in folder.glob(PARTIAL + "*"):
        try:
            pid = int(stage.name[len(PARTIAL) :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(stage, ignore_errors=True)


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
            signal.signal(s, handler)
        for number in caught[:1]:
            handler = previous[number]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL and number == signal.SIGINT:
                raise KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)


@contextlib.contextmanager
def output_set(folder: str | os.PathLike, record: str, templates: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a staging folder to write the command's files in; on success they replace the
    folder's earlier set (see the module's docstring), ``record`` (the command's JSON summary)
    last. On an exception, Ctrl+C or a cancel inside the block the folder is left as it was."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError("the output path exists and is not a folder", path=folder,
                         fix="Give a folder name, or move the file away")  # fmt: skip
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _clear_dead_partials(folder)
        stage = folder / f"{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}"
        stage.mkdir()
    except OSError as exc:
        raise save_error(exc, folder) from None
    manifest = folder / f".{Path(record).stem}.files"
    try:
        yield stage
        written = sorted(p.name for p in stage.iterdir())
        earlier = _earlier_set(folder, manifest, templates)
        with _signals_held():
            for name in sorted(written, key=lambda n: n == record):  # the record last
                os.replace(stage / name, folder / name)
            for name in sorted(earlier - set(written)):
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            write_text_atomic("\n".join(written) + "\n", manifest)
        if not durability_is_deferred():  # the renames on the disk (the files were flushed when written)
            _fsync_fd(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise save_error(exc, folder) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _earlier_set(folder: Path, manifest: Path, templates: Iterable[str]) -> set[str]:
    """The names the folder's previous set of this command wrote: its manifest, or the files the
    templates name (a folder of an earlier version)."""
    try:
        return {line for line in manifest.read_text().splitlines() if line and "/" not in line}
    except OSError:
        pass
    pattern = names_matching(templates) if templates else None
    if pattern is None:
        return set()
    return {p.name for p in folder.iterdir() if p.is_file() and pattern.match(p.name)}
