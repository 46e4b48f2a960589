"""A bedpostX folder read once, kept as uncompressed arrays that later runs memory-map.

Reading a bedpostX folder means inflating gigabytes of ``.nii.gz`` samples on one core (a
minute for an HCP subject). The first read therefore writes what it read — θ, φ, f as
(X, Y, Z, n_fibres, n_samples) float32 and the mask — as ``.npy`` files under the user's
cache folder (``$TRACTLENS_CACHE`` or ``$XDG_CACHE_HOME/tractlens``, ``bedpostx/``); the next
run maps them (``numpy.load(mmap_mode="c")``), which costs what the disk or the page cache
gives, and nothing of the data it does not touch.

An entry is valid while every source file has the size and modification time it had when
the entry was written, and the entry's :data:`FORMAT_VERSION` is this one. Entries are
written into a temporary folder and renamed into place, so a crash never leaves half of one.
Files modified in the last :data:`SETTLE_S` seconds are not cached (as git does for racily
clean files: a file rewritten within one clock tick keeps its time). A cache that cannot be
written (read-only, disk full) is one warning line; the data are then read directly.
``TRACTLENS_BEDPOSTX_CACHE=0`` turns the cache off.

A fit that writes a bedpostX folder has the samples already: it writes the entry too
(:func:`write_entry_masked`), so even the first tracking run maps them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from ._atomic import _REASONS

log = logging.getLogger(__name__)

#: Bumped whenever what is stored (or how it is read) changes: older entries are ignored.
FORMAT_VERSION = 1
#: Sources modified less than this many seconds before a read are not cached.
SETTLE_S = 2.0
ARRAYS = ("theta", "phi", "f", "mask")
#: What tracking derives from the samples (the engine's field: unit stick directions in voxel
#: axes, fractions, the voxel index), kept beside an entry once made (see :func:`save_derived`)
DERIVED = ("field_dirs", "field_f", "field_index")
#: Bumped whenever how the derived arrays are made changes (their files carry it in the name)
DERIVED_VERSION = 1


def _derived_file(entry: Path, name: str) -> Path:
    return entry / f"{name}-v{DERIVED_VERSION}.npy"


def cache_root() -> Path:
    """``$TRACTLENS_CACHE/bedpostx`` (or under ``$XDG_CACHE_HOME/tractlens``, ``~/.cache/tractlens``)."""
    root = os.environ.get("TRACTLENS_CACHE")
    if root:
        return Path(root) / "bedpostx"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tractlens" / "bedpostx"


def cache_enabled() -> bool:
    return os.environ.get("TRACTLENS_BEDPOSTX_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def entry_dir(folder: Path) -> Path:
    """The entry of a bedpostX folder: one per absolute folder path."""
    key = hashlib.sha256(str(folder.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return cache_root() / f"{key}-v{FORMAT_VERSION}"


def fingerprint(sources: list[Path]) -> list[dict]:
    """Name, size and modification time (ns) of every source file, in order."""
    prints = []
    for path in sources:
        stat = path.stat()
        prints.append({"name": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return prints


def load_entry(folder: Path, sources: list[Path]) -> dict[str, np.ndarray] | None:
    """The cached arrays of ``folder`` mapped from disk, or None when there is no valid entry."""
    entry = entry_dir(folder)
    try:
        manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT_VERSION or manifest.get("sources") != fingerprint(sources):
            return None
        # plain arrays over the maps (copy-on-write: a caller that writes into them changes no file)
        arrays = {
            name: np.asarray(np.load(entry / f"{name}.npy", mmap_mode="c", allow_pickle=False)) for name in ARRAYS
        }
        affine = np.asarray(manifest["affine"], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no entry, or a damaged one: read the folder (and write it again)
    shapes = {name: tuple(a.shape) for name, a in arrays.items()}
    if shapes != {name: tuple(s) for name, s in manifest.get("shapes", {}).items()}:
        return None
    arrays["affine"] = affine
    return arrays


def settled(sources: list[Path], now: float | None = None) -> bool:
    """Whether no source was modified in the last :data:`SETTLE_S` seconds."""
    now = time.time() if now is None else now
    return all(now - path.stat().st_mtime >= SETTLE_S for path in sources)


#: A temporary entry folder older than this is a killed writer's: the next writer of the entry removes it.
STALE_TMP_S = 3600.0


def _remove_stale_temporaries(entry: Path, now: float | None = None) -> None:
    now = time.time() if now is None else now
    with contextlib.suppress(OSError):
        for path in entry.parent.glob(f".{entry.name}.tmp-*"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(path, ignore_errors=True)


#: Entries being written behind reads in this process, by entry folder.
_PENDING: dict[Path, PendingEntry] = {}
_PENDING_LOCK = threading.Lock()


def wait_for_entry(folder: Path, timeout: float | None = None) -> None:
    """Wait while this process writes ``folder``'s entry behind a read (a second read then maps
    it instead of reading the files again)."""
    with _PENDING_LOCK:
        pending = _PENDING.get(entry_dir(folder))
    if pending is not None:
        pending.wait(timeout)


class PendingEntry:
    """An entry being written behind a read (:meth:`EntryWriter.write_behind`): :meth:`wait`
    gives the published entry (or None when it could not be written); :meth:`when_ready` runs
    a function with it once it is published (at once when it already is; never when it fails)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._entry: Path | None = None
        self._callbacks: list = []

    def wait(self, timeout: float | None = None) -> Path | None:
        self._done.wait(timeout)
        return self._entry

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def when_ready(self, callback) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        if self._entry is not None:
            callback(self._entry)

    def _finish(self, entry: Path | None) -> None:
        """Run the callbacks (those added meanwhile too), then let waiters go: a waiter sees
        what the callbacks did (e.g. the samples' ``cache_entry`` set)."""
        while True:
            with self._lock:
                self._entry = entry
                callbacks, self._callbacks = self._callbacks, []
                if not callbacks:
                    self._done.set()
                    return
            for callback in callbacks if entry is not None else ():
                try:
                    callback(entry)
                except Exception:  # a callback's failure (e.g. derived arrays not kept) stays its own
                    log.exception("after caching %s", entry)


class EntryWriter:
    """An entry written array by array (each as soon as it is complete, possibly on other threads),
    then published at once by :meth:`commit`; nothing is visible to readers before that.

    Every failure (no space, no permission) is kept and reported by :meth:`commit` as one warning;
    the temporary folder is then removed, so a failed write never leaves half an entry."""

    def __init__(self, folder: Path, sources: list[Path], prints: list[dict]):
        self.folder, self.sources, self.prints = folder, sources, prints
        self.entry = entry_dir(folder)
        self.tmp = self.entry.with_name(f".{self.entry.name}.tmp-{secrets.token_hex(4)}")
        self.error: OSError | None = None
        self.saved: dict[str, tuple[int, ...]] = {}
        self._created = False
        self._lock = threading.Lock()

    def begin(self, needed: int) -> bool:
        """Make the temporary folder when ``needed`` bytes fit on the disk; False (error kept) if not."""
        try:
            self.entry.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temporaries(self.entry)
            free = shutil.disk_usage(self.entry.parent).free
            if needed + (256 << 20) > free:
                raise OSError(28, f"needs {needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
            self.tmp.mkdir()
            self._created = True
        except OSError as exc:
            self.error = exc
        return self.error is None

    def create(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray | None:
        """A writable map of one array's ``.npy`` file in the entry being written, its blocks
        reserved on the disk (no SIGBUS when the disk fills while pages are written), for a reader
        to fill in place: no second copy of the array and no write of it afterwards (the kernel
        writes the dirty pages back when it likes). None, with the error kept, when it cannot be made.
        The shape is recorded as saved: the caller fills it completely or abandons the entry."""
        if self.error is not None or not self._created:
            return None
        path = self.tmp / f"{name}.npy"
        try:
            out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
            if hasattr(os, "posix_fallocate") and out.nbytes:
                with open(path, "r+b") as fh:
                    os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
        except OSError as exc:
            with self._lock:
                self.error = self.error or exc
            return None
        with self._lock:
            self.saved[name] = tuple(shape)
        return out

    def published(self, name: str) -> np.ndarray:
        """One array of the published entry, mapped copy-on-write (as :func:`load_entry` maps it)."""
        return np.asarray(np.load(self.entry / f"{name}.npy", mmap_mode="c", allow_pickle=False))

    def save_scattered(self, name: str, mask: np.ndarray, values: np.ndarray, block: int = 1 << 16) -> None:
        """Write one (X, Y, Z, ...) array of the entry from the values of the voxels in ``mask`` only
        ((N, ...), ``mask``'s C order): the file is made at full size (zeros, sparse where the file
        system allows) and filled a block of voxels at a time, so the grid array is never in memory."""
        if self.error is not None or not self._created:
            return
        out = self.create(name, (*mask.shape, *values.shape[1:]), values.dtype)
        if out is None:
            return
        flat = out.reshape(mask.size, *values.shape[1:])
        inside = np.flatnonzero(mask)
        for start in range(0, inside.size, block):
            flat[inside[start : start + block]] = values[start : start + block]
        del flat, out

    def save(self, name: str, array: np.ndarray) -> None:
        """Write one array of the entry (thread-safe; after a failure, nothing more is written)."""
        if self.error is not None or not self._created:
            return
        try:
            np.save(self.tmp / f"{name}.npy", np.asarray(array), allow_pickle=False)
        except OSError as exc:
            with self._lock:
                self.error = self.error or exc
            return
        with self._lock:
            self.saved[name] = tuple(array.shape)

    def commit(self, affine: np.ndarray) -> Path | None:
        """Publish the entry (all of :data:`ARRAYS` saved, sources unchanged since ``prints``);
        returns it, or None with one warning line (or one info line when a source changed)."""
        try:
            if self.error is not None:
                raise self.error
            if fingerprint(self.sources) != self.prints:
                log.info("%s changed while it was read; not cached", self.folder)
                return None
            manifest = {
                "format": FORMAT_VERSION,
                "folder": str(self.folder.resolve()),
                "sources": self.prints,
                "shapes": {name: list(self.saved[name]) for name in ARRAYS},
                "affine": np.asarray(affine, dtype=np.float64).tolist(),
            }
            (self.tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            if self.entry.exists():
                shutil.rmtree(self.entry, ignore_errors=True)  # a stale entry of this folder
            os.replace(self.tmp, self.entry)
        except OSError as exc:
            reason = _REASONS.get(exc.errno, exc.strerror or str(exc))
            log.warning(
                "could not cache the bedpostX folder %s in %s (%s); it is read directly each time",
                self.folder,
                self.entry,
                reason,
            )
            return None
        finally:
            self.abandon()
        size = sum(int(np.prod(shape)) * (1 if name == "mask" else 4) for name, shape in self.saved.items())
        log.warning(
            "bedpostX folder %s cached in %s (%.1f GiB); later runs map it instead of reading it",
            self.folder,
            self.entry,
            size / 2**30,
        )
        return self.entry

    def write_behind(self, arrays: dict[str, np.ndarray], affine: np.ndarray) -> PendingEntry:
        """Write ``arrays`` (all of :data:`ARRAYS`) and :meth:`commit` on a thread of their own,
        the three sample arrays at once, while the caller goes on with them (a tracking run uploads
        and tracks meanwhile). The thread is not a daemon: the interpreter finishes the entry before
        it exits, and a process killed first leaves only a temporary folder, which a later writer
        removes (:meth:`begin`). The caller must not write into the arrays (they are made read-only)."""
        for name in ARRAYS[:3]:
            arrays[name].flags.writeable = False
        pending = PendingEntry()
        with _PENDING_LOCK:
            _PENDING[self.entry] = pending
        # every thread is started here, by the caller: a thread the interpreter is already waiting
        # for at exit may not start new ones (a pool's submit then fails)
        savers = []
        if self.begin(sum(int(arrays[name].nbytes) for name in ARRAYS)):
            savers = [threading.Thread(target=self.save, args=(name, arrays[name]), name=f"tractlens-cache-{name}",
                                       daemon=False) for name in ARRAYS]  # fmt: skip
            for saver in savers:
                saver.start()

        def publish() -> None:
            entry = None
            try:
                for saver in savers:
                    saver.join()
                entry = self.commit(affine)  # also the one warning line when it could not be written
            finally:
                self.abandon()
                with _PENDING_LOCK:
                    if _PENDING.get(self.entry) is pending:
                        del _PENDING[self.entry]
                pending._finish(entry)

        threading.Thread(target=publish, name="tractlens-bedpostx-cache", daemon=False).start()
        return pending

    def abandon(self) -> None:
        """Remove the temporary folder (nothing once it was published)."""
        with contextlib.suppress(OSError):
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)


def write_entry(folder: Path, sources: list[Path], arrays: dict[str, np.ndarray], prints: list[dict]) -> Path | None:
    """Write ``arrays`` (theta, phi, f, mask, affine) as ``folder``'s entry; ``prints`` is the
    :func:`fingerprint` taken before the files were read (a file changed meanwhile is not cached).

    Returns the entry, or None with one warning line when it cannot be written."""
    writer = EntryWriter(folder, sources, prints)
    if fingerprint(sources) != prints:
        log.info("%s changed while it was read; not cached", folder)
        return None
    if writer.begin(sum(int(arrays[name].nbytes) for name in ARRAYS)):
        for name in ARRAYS:
            writer.save(name, arrays[name])
    return writer.commit(arrays["affine"])


def write_entry_masked(
    folder: Path,
    sources: list[Path],
    mask: np.ndarray,
    affine: np.ndarray,
    samples: dict[str, np.ndarray],
) -> Path | None:
    """The entry of a folder just written from the masked samples ``samples`` (theta, phi, f as
    (N, n_fibres, n_samples) float32 in ``mask``'s C order), with ``affine`` as the written mask's
    header gives it, so that a later read maps exactly what reading the files would give.

    ``sources`` are fingerprinted now: the writer has just renamed them into place, so the
    settling rule for files that may still be being written does not apply."""
    prints = fingerprint(sources)
    writer = EntryWriter(folder, sources, prints)
    mask = np.asarray(mask, dtype=bool)
    if writer.begin(sum(mask.size * int(np.prod(samples[name].shape[1:])) * 4 for name in ARRAYS[:3]) + mask.size):
        for name in ARRAYS[:3]:
            writer.save_scattered(name, mask, np.asarray(samples[name], dtype=np.float32))
        writer.save("mask", mask)
    return writer.commit(affine)


def load_derived(entry: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray] | None:
    """The derived arrays kept in ``entry`` (mapped, copy-on-write), or None when any is missing
    or damaged (or, with ``shapes``, of other shapes)."""
    try:
        arrays = {name: np.load(_derived_file(entry, name), mmap_mode="c", allow_pickle=False) for name in DERIVED}
    except (OSError, ValueError):
        return None
    if shapes is not None and any(tuple(arrays[k].shape) != tuple(v) for k, v in shapes.items()):
        return None
    return {name: np.asarray(a) for name, a in arrays.items()}


def save_derived(entry: Path, arrays: dict[str, np.ndarray]) -> bool:
    """Keep derived arrays in an existing entry: each written under a temporary name and renamed,
    so a reader sees all of one or none (a reader needs all of :data:`DERIVED`). A failure is one
    info line: the arrays are made again next time."""
    if not (entry / "manifest.json").exists():
        return False
    written = []
    try:
        for name in DERIVED:
            tmp = entry / f".{name}.tmp-{secrets.token_hex(4)}.npy"
            np.save(tmp, np.asarray(arrays[name]), allow_pickle=False)
            written.append((tmp, _derived_file(entry, name)))
        for tmp, final in written:
            os.replace(tmp, final)
    except OSError as exc:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        log.info("could not keep the tracking field beside %s (%s)", entry, exc)
        return False
    return True
