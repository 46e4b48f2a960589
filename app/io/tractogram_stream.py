"""Tractograms written as they are computed: open, append parts, close — never the whole in memory.

A whole-brain run makes hundreds of millions of points; holding them (and their copies) until
the end needs a server's memory. :func:`open_tractogram_writer` gives a writer that takes one
:class:`~app.model.Tractogram` part at a time (voxel coordinates of the grid given at open;
the same scalar names in every part) and writes it at once:

- ``.trk`` and ``.tck`` (:mod:`.tractogram_stream_nib`): each part goes through nibabel's own
  writer into a buffer; its streamline records are appended to the file and the header
  (streamline count; a .tck's content timestamp) is written at close, so the file has the same
  bytes as :func:`~app.io.tractogram.save_tractogram` of the whole. A .tck's scalars grow in
  their side files (``.tsf`` per point, text per streamline; :mod:`.tractogram_tsf`) beside it.
- ``.trx``: trx-python's uncompressed layout (``positions.3.float32``, ``offsets.uint32``,
  ``dpv/``, ``dps/``, ``header.json``, STORED members, :mod:`._zip_stored`): the positions are
  written straight into their member of the zip, the other arrays grow beside it and are copied
  in at close; the members are byte for byte those of ``save_tractogram``. Positions may be float16
  (``positions_dtype``), which halves the file (about 0.01 mm error at 100 mm).

With ``background=True`` the parts are written by the writer's own thread while the caller
computes the next ones (``track deterministic`` does so).

Writes are atomic (:func:`~app.io._atomic.atomic_path`): the file appears under its name at
:meth:`TractogramWriter.close`; a failure or a cancel (leaving the ``with`` block by an
exception, :meth:`TractogramWriter.abort`) removes what was written, and a killed process
leaves only a hidden temporary beside it, never half a file under the final name.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import json
import os
import queue
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..model import Tractogram
from ._atomic import atomic_path, durability_is_deferred, save_error
from ._zip_stored import StoredZip, crc32
from .tractogram import (
    _suffix,
    check_output_suffix,
    trx_reference,
)
from .tractogram_points import points_world_float32
from .tractogram_stream_nib import NibabelParts

__all__ = ["POSITION_DTYPES", "QUEUED_POINTS", "TractogramWriter", "open_tractogram_writer"]

#: Position dtypes of a written tractogram: float32 everywhere, float16 in .trx only.
POSITION_DTYPES = ("float32", "float16")
#: Points a background writer may have queued before :meth:`TractogramWriter.append` waits: about
#: one GPU batch (2^18 seeds), whose pieces (views of its arrays) are written while the next batch
#: is tracked; 64 M points are 1 GB of float32 positions and FA.
QUEUED_POINTS = 1 << 26
#: Bytes of a .trx's positions (and, at close, of the arrays copied in after them) after which
#: the writer has the system start writing them to the disk (:func:`_start_writeback`), so the
#: disk works while the tracking goes on and the flush at close finds little left: four batch workers closing 5 GB tractograms at once on one disk
#: otherwise wait for each other's flushes.
WRITEBACK_BYTES = 256 << 20


class TractogramWriter:
    """Append :class:`Tractogram` parts to a .trk/.tck/.trx file; see the module's description.

    Use as a context manager (closed on success, aborted on an exception) or call
    :meth:`close` / :meth:`abort` yourself. ``streamlines`` and ``points`` count what was
    written.

    With ``background=True`` a thread of the writer writes the parts while the caller computes
    the next ones (the arrays' work and the file's writes release the GIL): :meth:`append`
    checks the part and queues it, waiting only while ``queued_points`` (:data:`QUEUED_POINTS`)
    points are queued, so memory stays bounded. A failure of the thread comes out of the next :meth:`append` or
    of :meth:`close`, as it would have come out of the append that met it, and the file is
    dropped.
    """

    def __init__(
        self,
        path,
        affine,
        dimensions,
        *,
        keep_scalars: bool = True,
        positions_dtype: str = "float32",
        background: bool = False,
        queued_points: int = QUEUED_POINTS,
        points_in_mm: bool = False,
    ):
        self.path = check_output_suffix(path)
        self.points_in_mm = points_in_mm
        self.suffix = _suffix(self.path)
        if positions_dtype not in POSITION_DTYPES:
            raise ValueError(f"positions_dtype must be one of {', '.join(POSITION_DTYPES)}, got {positions_dtype!r}")
        if positions_dtype != "float32" and self.suffix != ".trx":
            raise ValueError(f"{self.suffix} files hold float32 positions; float16 is for .trx")
        self.affine = np.asarray(affine, dtype=np.float64)
        self.dimensions = tuple(int(d) for d in dimensions)
        self.keep_scalars = keep_scalars
        self.positions_dtype = np.dtype(positions_dtype)
        self.streamlines = 0
        self.points = 0
        #: seconds of the writer's stages: ``world`` (points to float32 RAS mm), ``file``
        #: (the parts' bytes into the file, with the zip's CRC), ``finish`` (at close: a .trx's
        #: other arrays copied into it, the header), ``flush`` (to the disk and renamed into place)
        self.seconds = {"world": 0.0, "file": 0.0, "finish": 0.0, "flush": 0.0}
        self._names: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        #: float32 RAS mm of the part being written, kept for the next part: a fresh array's first
        #: touch (page faults; on a new virtual machine, the host's too) cost about as much as the
        #: conversion itself, more with several batch workers at once. Each part's bytes are in
        #: the file before :meth:`world` is called again (one thread writes them).
        self._scratch = np.empty((0, 3), np.float32)
        self._stack = contextlib.ExitStack()
        self._tmp = self._stack.enter_context(atomic_path(self.path))
        self._open = True
        self._worker: threading.Thread | None = None
        self._failure: BaseException | None = None
        try:
            self._format = (_TrxParts if self.suffix == ".trx" else NibabelParts)(self)
        except BaseException:
            self.abort()
            raise
        if background:
            self._queue: queue.Queue = queue.Queue()  # bounded by the points queued
            self._room = threading.Condition()
            self._queued_points, self._max_queued = 0, int(queued_points)
            self._worker = threading.Thread(target=self._write_queued, name="tractogram writer", daemon=True)
            self._worker.start()

    def world(self, points) -> np.ndarray:
        """A part's points as float32 RAS mm for the file (timed as ``world``, not ``file``)."""
        t0 = time.perf_counter()
        if self.points_in_mm:
            out = np.asarray(points, dtype=np.float32)
        elif np.result_type(points.dtype, np.float32) != np.float32:
            out = points_world_float32(points, self.affine)
        else:  # into the part before's memory: fresh pages cost as much as the product (see _scratch)
            if len(self._scratch) < len(points):
                self._scratch = np.empty((max(len(points), len(self._scratch) * 5 // 4), 3), np.float32)
            out = points_world_float32(points, self.affine, self._scratch[: len(points)])
        seconds = time.perf_counter() - t0
        self.seconds["world"] += seconds
        self.seconds["file"] -= seconds
        return out

    def world_of(self, part: Tractogram) -> np.ndarray:
        """:meth:`world` of ``part``'s points; a part that holds its points as checked float32
        millimetres already (:class:`~app.tractogram.MappedPoints`: a GPU tracker's, or a .trx
        file's) gives those, as they are: neither converted to voxels nor back."""
        mapped = part.mapped
        if self.points_in_mm or mapped is None or not mapped.checked or mapped.world.dtype != np.float32:
            return self.world(part.points)
        return np.asarray(mapped.world)

    def append(self, part: Tractogram) -> None:
        """Write the streamlines of ``part`` (voxel coordinates of this writer's grid, or RAS mm for
        a writer opened with ``points_in_mm``)."""
        if not self._open:
            raise ValueError(f"{self.path}: the writer is closed")
        if not np.array_equal(part.affine, self.affine):
            raise ValueError(f"{self.path}: a part on another grid (its affine differs from the writer's)")
        names = (tuple(part.point_scalars), tuple(part.streamline_scalars)) if self.keep_scalars else ((), ())
        if self._names is None:
            self._names = names
        elif names != self._names:
            raise ValueError(f"{self.path}: every part must have the scalars {self._names}, got {names}")
        if len(part) == 0:
            return
        if self._worker is not None:
            self._queue_part(part)
            return
        try:
            self._write(part)
        except BaseException as exc:
            self._failed(exc)

    def _write(self, part: Tractogram) -> None:
        t0 = time.perf_counter()
        self._format.append(part)
        self.seconds["file"] += time.perf_counter() - t0
        self.streamlines += len(part)
        self.points += part.n_points

    def _queue_part(self, part: Tractogram) -> None:
        """Queue ``part`` for the thread once there is room for its points (always when none are)."""
        n = part.n_points
        with self._room:
            self._room.wait_for(
                lambda: (
                    self._failure is not None or not self._queued_points or self._queued_points + n <= self._max_queued
                )
            )
            self._queued_points += n
        self._raise_failure()
        self._queue.put(part)

    def _write_queued(self) -> None:
        """The thread of ``background=True``: the queued parts, in order, until ``None``."""
        while (part := self._queue.get()) is not None:
            if self._failure is None and self._open:
                try:
                    self._write(part)
                except BaseException as exc:  # given to the caller by its next append or close
                    self._failure = exc
            with self._room:
                self._queued_points -= part.n_points
                self._room.notify_all()
            del part

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            self._failed(self._failure)

    def _failed(self, exc: BaseException):
        """Drop the file and raise ``exc`` (a failure to write as a :class:`SaveError`)."""
        self.abort()
        if isinstance(exc, OSError):
            raise save_error(exc, self.path) from exc
        raise exc

    def close(self) -> Path:
        """Finish the file (after the queued parts) and move it to its name."""
        if not self._open:
            return self.path
        self._stop_worker()
        self._raise_failure()
        t0 = time.perf_counter()
        try:
            self._format.finish()
        except OSError as exc:
            self.abort()
            raise save_error(exc, self.path) from exc
        except BaseException:
            self.abort()
            raise
        self._open = False
        t1 = time.perf_counter()
        self._stack.close()  # flush, rename (errors become SaveError there)
        self.seconds["finish"] += t1 - t0
        self.seconds["flush"] += time.perf_counter() - t1
        return self.path

    def abort(self) -> None:
        """Drop what was written; the target (and any previous file there) is left as it was."""
        if not self._open:
            return
        self._open = False  # the thread drops what is still queued
        self._stop_worker()
        with contextlib.suppress(Exception):
            self._format.discard()
        # leaving atomic_path by an exception removes its temporary file
        self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)

    @property
    def tmp(self) -> Path:
        return self._tmp

    def __enter__(self) -> TractogramWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def open_tractogram_writer(
    path: str | os.PathLike,
    affine,
    dimensions,
    *,
    keep_scalars: bool = True,
    positions_dtype: str = "float32",
    background: bool = False,
    queued_points: int = QUEUED_POINTS,
    points_in_mm: bool = False,
) -> TractogramWriter:
    """A :class:`TractogramWriter` for ``path`` (format from the suffix) on the grid
    (``affine`` voxel -> RAS mm, ``dimensions``) of the parts to come; ``background``: written
    by a thread while the caller goes on (at most ``queued_points`` points queued);
    ``points_in_mm``: the parts' points are RAS mm already (a tractogram read as it is stored,
    :mod:`.tractogram_mapped`), written as they are."""
    return TractogramWriter(
        path,
        affine,
        dimensions,
        keep_scalars=keep_scalars,
        positions_dtype=positions_dtype,
        background=background,
        queued_points=queued_points,
        points_in_mm=points_in_mm,
    )


class _TrxParts:
    """.trx: trx-python's uncompressed layout (STORED members) written as it grows.

    The positions, most of the bytes, go straight into their member of the final zip (one
    write per part, its CRC computed on the way); the other arrays, which must follow as
    members of their own, grow in files beside it, their CRCs kept as they grow, and are copied
    in at close by the kernel (:class:`~._zip_stored.StoredZip`). So the positions are written
    once, at the disk's speed, instead of to a folder and again into the zip in small blocks
    (trx-python's ``zip_from_folder``), and the other arrays are never read back. A part's other
    arrays are written by a thread of their own while its positions go into the zip (other
    files: the system writes them side by side); :meth:`append` returns once both are written,
    so the caller may change its arrays then, as with the other formats."""

    def __init__(self, writer: TractogramWriter):
        from trx.utils import get_reference_info_wrapper

        self.writer = writer
        affine, dimensions, _, _ = get_reference_info_wrapper(trx_reference(writer.affine, writer.dimensions))
        self.header = {"DIMENSIONS": dimensions, "VOXEL_TO_RASMM": affine}
        self.files: dict[str, io.BufferedWriter] = {}
        self.crcs: dict[str, int] = {}  # of each file's bytes so far
        self.zip = StoredZip(writer.tmp)
        self.folder = writer.tmp.with_name(writer.tmp.name + ".parts")
        try:
            self.folder.mkdir()
        except BaseException:
            self.zip.discard()
            raise
        self.side = ThreadPoolExecutor(1, thread_name_prefix="trx arrays")
        self.pending: Future | None = None  # the part's other arrays, being written beside its positions
        self.positions = False  # whether the member is begun; none in an empty tractogram (as trx-python)
        self.written_back = 0  # the zip's bytes whose writing to the disk has been started

    def _put(self, arrays: list[tuple[str, np.ndarray]]) -> None:
        """Append each array's bytes to its file beside the zip (``name``, little-endian values)."""
        for name, values in arrays:
            handle = self.files.get(name)
            if handle is None:
                target = self.folder / name
                target.parent.mkdir(exist_ok=True)
                handle = self.files[name] = open(target, "wb")
            handle.write(values.data)
            self.crcs[name] = crc32(values.data, self.crcs.get(name, 0))

    def _settle(self) -> None:
        """Wait for the part's other arrays (their failure raised here)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    @staticmethod
    def _name(kind: str, key: str, values: np.ndarray) -> str:
        # trx-python's names: (n,) and (n, 1) -> key.dtype, (n, k) -> key.k.dtype
        dim = "" if values.ndim == 1 or values.shape[1] == 1 else f".{values.shape[1]}"
        return f"{kind}/{key}{dim}.{values.dtype.name}"

    def append(self, part: Tractogram) -> None:
        writer = self.writer
        starts = part.offsets[:-1] + writer.points
        if part.offsets[-1] + writer.points > np.iinfo(np.uint32).max:  # the last offset is the point count
            raise ValueError(f"{writer.path}: more than 2^32 points do not fit trx-python's uint32 offsets")
        positions = writer.world_of(part).astype(writer.positions_dtype, copy=False)
        positions = np.ascontiguousarray(positions.astype(positions.dtype.newbyteorder("<"), copy=False))
        arrays = [("offsets.uint32", starts.astype("<u4"))]
        if writer.keep_scalars:
            for kind, scalars in (("dpv", part.point_scalars), ("dps", part.streamline_scalars)):
                for key, values in scalars.items():
                    values = np.ascontiguousarray(values, dtype="<f4")
                    arrays.append((self._name(kind, key, values), values))
        self.pending = self.side.submit(self._put, arrays)
        if not self.positions:
            self.zip.begin(f"positions.3.{positions.dtype.name}")
            self.positions = True
        self.zip.write(positions.data)
        self.written_back = _start_writeback(self.zip, self.written_back)
        self._settle()

    def finish(self) -> None:
        writer = self.writer
        self._settle()
        self.side.shutdown()
        if writer.streamlines:
            self._put([("offsets.uint32", np.array([writer.points], "<u4"))])
        if self.positions:
            self.zip.end()
        for handle in self.files.values():
            handle.close()
        if writer.streamlines:  # trx-python writes no arrays for an empty tractogram
            for name in self.files:  # the disk's writes started as each comes in
                self.zip.copy(name, self.folder / name, self.crcs[name])
                self.written_back = _start_writeback(self.zip, self.written_back)
        header = {
            "DIMENSIONS": self.header["DIMENSIONS"].tolist(),
            "VOXEL_TO_RASMM": self.header["VOXEL_TO_RASMM"].tolist(),
            "NB_VERTICES": writer.points,
            "NB_STREAMLINES": writer.streamlines,
        }
        self.zip.add("header.json", json.dumps(header).encode())
        self.zip.close()
        shutil.rmtree(self.folder)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self._settle()
        self.side.shutdown()
        for handle in self.files.values():
            with contextlib.suppress(Exception):
                handle.close()
        self.zip.discard()
        shutil.rmtree(self.folder, ignore_errors=True)


def _start_writeback(file, since: int, least: int | None = None) -> int:
    """Have the system start writing ``file``'s bytes from ``since`` to its end to the disk, once
    there are at least ``least`` (:data:`WRITEBACK_BYTES`) of them, without waiting. On Linux
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts the write-out of the dirty pages and keeps
    them in the page cache, so the next step of a batch (the connectome reading the streamlines'
    ends of this very file) reads them from memory; where that call is missing or refused,
    ``posix_fadvise(DONTNEED)``, which also starts the write-out but drops the pages already
    clean from the cache; elsewhere nothing. The file is still flushed before its rename, as
    ever: this only spreads the disk's work over the run. ``TRACTLENS_WRITEBACK=fadvise``
    (:data:`ENV_WRITEBACK`) takes ``posix_fadvise`` even where ``sync_file_range`` exists (to
    compare the two on a machine). Returns the offset now started up to."""
    if durability_is_deferred():  # a batch flushes the file after the step, off the command's path
        return since
    advise = getattr(os, "posix_fadvise", None)
    keep_cached = os.environ.get(ENV_WRITEBACK, "").strip().lower() != "fadvise"
    sync_range = _sync_file_range() if keep_cached else None
    if advise is None and sync_range is None:
        return since
    file.flush()
    end = file.tell()
    if end - since < (WRITEBACK_BYTES if least is None else least):
        return since
    if sync_range is not None and sync_range(file.fileno(), since, end - since) == 0:
        return end
    if advise is None:
        return end
    try:
        advise(file.fileno(), since, end - since, os.POSIX_FADV_DONTNEED)
    except OSError:  # a file system that does not take the advice: the flush at close does it all
        return end
    return end


#: ``fadvise``: start the early writes with ``posix_fadvise(DONTNEED)`` (pages dropped once
#: written), not ``sync_file_range``; see :func:`_start_writeback`.
ENV_WRITEBACK = "TRACTLENS_WRITEBACK"
#: ``SYNC_FILE_RANGE_WRITE`` of Linux's ``<fcntl.h>``: start writing the range's dirty pages.
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range():
    """Linux's ``sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`` through the C
    library, as a function of (fd, offset, nbytes) giving 0 or an errno; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> int:
        return 0 if call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0 else ctypes.get_errno() or -1

    return start
