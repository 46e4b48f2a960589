"""Autosave and crash recovery: the work of a window survives a crash of TractLens or the machine.

Every running window owns a folder in the recovery root (:func:`recovery_root`)::

    RECOVERY_ROOT/20261124-101500-4242-1a2b/
        owner.lock      held (flock) by the process while it runs: the kernel lets go of it
                        when the process ends in any way, SIGKILL and power cut included
        owner.json      pid, host, start time, TractLens version
        manifest.json   a session manifest (:mod:`app.session`), plus "autosaved": the time
        layers/         its side files

The window calls :meth:`AutoSaver.tick` every N seconds: it takes a snapshot of the document
on the calling (GUI) thread and writes it on a background thread through
:class:`~app.session.SessionFolder`, which rewrites only side files whose content changed
(a painted ROI, a new result) and replaces the manifest atomically. A clean exit deletes the
folder. At the next start, :func:`find_orphans` lists folders whose lock nobody holds (their
owner died) and that hold an autosave; the window offers to restore the newest one, which is
:func:`app.session.load_session` on the folder.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .session import MANIFEST, DocumentSnapshot, SessionFolder

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0
LOCK_NAME = "owner.lock"
OWNER_NAME = "owner.json"


def recovery_root() -> Path:
    """Where autosaves go: ``$TRACTLENS_RECOVERY_DIR``; else ``recovery`` in
    ``$TRACTLENS_CONFIG_DIR`` when that is set (tests, kiosks); else
    ``$XDG_STATE_HOME/tractlens/recovery`` (default ``~/.local/state/tractlens/recovery``)."""
    explicit = os.environ.get("TRACTLENS_RECOVERY_DIR")
    if explicit:
        return Path(explicit)
    config = os.environ.get("TRACTLENS_CONFIG_DIR")
    if config:
        return Path(config) / "recovery"
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "tractlens" / "recovery"


class _FileLock:
    """An exclusive, non-blocking lock on a file that the OS drops when the process dies."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.name == "nt":  # pragma: no cover - Windows
                import msvcrt

                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            else:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


@dataclass
class Orphan:
    """The autosave of a window whose process ended without closing it."""

    folder: Path
    autosaved: str
    layer_names: list[str]
    roi_count: int
    pid: int | None
    lock: _FileLock  # held by this process while the orphan is offered

    def describe(self) -> str:
        names = ", ".join(self.layer_names[:6]) + (" …" if len(self.layer_names) > 6 else "")
        rois = f", {self.roi_count} ROI{'s' if self.roi_count != 1 else ''}" if self.roi_count else ""
        return f"autosaved {self.autosaved}: {len(self.layer_names)} layers{rois} ({names})"

    def release(self) -> None:
        """Keep it for a later start (another window may offer it then)."""
        self.lock.release()

    def discard(self) -> None:
        """Delete it (after a restore has been autosaved again, or when the user declines)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.lock.release()


def find_orphans(root: str | os.PathLike | None = None) -> list[Orphan]:
    """Autosaves whose owner is gone, newest first; each one locked for this process.

    Folders of windows still running (their lock is held) are skipped; a dead owner's folder
    with no autosave in it (it died before its first one) is deleted.
    """
    root = Path(root) if root is not None else recovery_root()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        lock = _FileLock(folder / LOCK_NAME)
        try:
            if not lock.acquire():
                continue  # its window is running
        except OSError:
            continue
        orphan = _read_orphan(folder, lock)
        if orphan is None:
            shutil.rmtree(folder, ignore_errors=True)
            lock.release()
        else:
            found.append(orphan)
    found.sort(key=lambda o: o.autosaved, reverse=True)
    return found


def _read_orphan(folder: Path, lock: _FileLock) -> Orphan | None:
    """The orphan in ``folder``; None when there is nothing to restore (no autosave was written,
    or it holds no layer). A manifest that cannot be read is still offered, never deleted
    unasked: restoring it says what is wrong and keeps the files."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None
    try:
        owner = json.loads((folder / OWNER_NAME).read_text(encoding="utf-8"))
        pid = owner.get("pid") if isinstance(owner, dict) else None
    except (OSError, ValueError):
        pid = None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        layers = manifest["layers"]
        names = [str(entry.get("name", "?")) for entry in layers]
        rois = sum(1 for entry in layers if entry.get("kind") == "roi")
        autosaved = str(manifest.get("autosaved", manifest.get("saved", "?")))
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest_path.stat().st_mtime))
        return Orphan(folder, f"{mtime} (its list of layers cannot be read)", [], 0, pid, lock)
    if not names:
        return None
    return Orphan(folder, autosaved, names, rois, pid, lock)


class RecoveryStore:
    """This process's recovery folder: created and locked by :meth:`open`, deleted by :meth:`close`."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else recovery_root()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.folder = self.root / f"{stamp}-{os.getpid()}-{secrets.token_hex(2)}"
        self._lock = _FileLock(self.folder / LOCK_NAME)
        self.writer = SessionFolder(self.folder)

    def open(self) -> RecoveryStore:
        # Made and locked under a hidden name, then renamed: another window looking for orphans
        # at this moment never sees an unlocked folder of a live process.
        hidden = self.folder.with_name("." + self.folder.name)
        hidden.mkdir(parents=True)
        lock = _FileLock(hidden / LOCK_NAME)
        if not lock.acquire():
            raise OSError(f"cannot lock the recovery folder {hidden}")
        self._lock = lock
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tractlens": __version__,
        }
        (hidden / OWNER_NAME).write_text(json.dumps(owner), encoding="utf-8")
        os.replace(hidden, self.folder)
        return self

    def write(self, snap: DocumentSnapshot) -> bool:
        """Autosave ``snap``; False when nothing changed since the last time."""
        if not snap.layers and self.writer.last_state is None:
            return False  # nothing to lose yet
        return self.writer.write(snap, extra={"autosaved": time.strftime("%Y-%m-%d %H:%M:%S")})

    def close(self) -> None:
        """A clean exit: the autosave is no longer needed."""
        self._lock.release()
        shutil.rmtree(self.folder, ignore_errors=True)


class AutoSaver:
    """Writes snapshots to a :class:`RecoveryStore` on a background thread.

    ``take_snapshot`` runs on the thread calling :meth:`tick` (the GUI thread: the document is
    only ever touched there); the write runs on a daemon thread, one at a time: a tick while the
    previous write is still running is skipped. ``on_saved()`` / ``on_error(message)`` are called
    on the writing thread.
    """

    def __init__(
        self,
        store: RecoveryStore,
        take_snapshot: Callable[[], DocumentSnapshot],
        *,
        on_saved: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ):
        self.store = store
        self.take_snapshot = take_snapshot
        self.on_saved = on_saved
        self.on_error = on_error
        self._thread: threading.Thread | None = None
        self.writes = 0  # autosaves written (ticks where something had changed)
        self.snapshot_time = 0.0  # time.monotonic() of the last snapshot taken
        self.last_error = ""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def tick(self) -> bool:
        """Start an autosave unless one is running; True when one was started."""
        if self.busy:
            return False
        snap = self.take_snapshot()
        self.snapshot_time = time.monotonic()
        self._thread = threading.Thread(target=self._write, args=(snap,), name="tractlens-autosave", daemon=True)
        self._thread.start()
        return True

    def _write(self, snap: DocumentSnapshot) -> None:
        try:
            written = self.store.write(snap)
        except Exception as exc:  # a full disk must not take the window down: say it, try again later
            self.last_error = str(exc)
            log.warning("autosave failed: %s", exc)
            if self.on_error is not None:
                self.on_error(str(exc))
            return
        self.last_error = ""
        if written:
            self.writes += 1
            if self.on_saved is not None:
                self.on_saved()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the write in flight (if any) is done."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.busy
