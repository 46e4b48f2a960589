"""gzip for NIfTI files through python-isal (ISA-L) when it is installed, else the standard library.

Most of the time a command spends on a ``.nii.gz`` is deflate on one core. ISA-L inflates
several times faster than zlib, and ``isal.igzip_threaded`` compresses blocks on several
threads (as pigz does). Both write ordinary gzip streams: any reader (FSL, MRtrix, zlib)
reads them, and the data they hold are the same bytes. The optional dependency comes with
the ``fast-io`` extra (``pip install 'tractlens[fast-io]'``) and is imported only when a
``.gz`` file is opened.

:func:`install` registers :func:`gzip_open` as nibabel's opener for ``.gz`` images (the
documented ``ImageOpener.compress_ext_map`` hook, which nibabel also uses for its own
``indexed_gzip`` reader), so ``nib.load`` and ``nib.save`` use it. ``TRACTLENS_FAST_GZIP=0``
turns it off (e.g. to compare).
"""

from __future__ import annotations

import functools
import io
import logging
import os

from nibabel import openers
from nibabel._compression import gzip_open as nibabel_gzip_open

log = logging.getLogger(__name__)

#: Most threads one file is compressed on (a command writes several files at once).
MAX_WRITE_THREADS = 4
#: ISA-L's levels are 0..3; zlib's 1..9 map onto them by speed (nibabel writes zlib level 1).
_ISAL_LEVEL = {0: 0, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 3, 8: 3, 9: 3}


@functools.lru_cache(maxsize=1)
def _isal():
    """The ``isal`` modules, or None when the package is not installed (or broken)."""
    try:
        from isal import igzip_threaded, isal_zlib
    except Exception as exc:  # ImportError, or a wheel built for another CPU
        log.debug("python-isal not usable (%s): gzip through the standard library", exc)
        return None
    return isal_zlib, igzip_threaded


def fast_gzip_enabled() -> bool:
    """Whether ``.gz`` files go through ISA-L (installed and not turned off)."""
    if os.environ.get("TRACTLENS_FAST_GZIP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _isal() is not None


class _PositionedWriter(io.RawIOBase):
    """A stream writer that knows its position: nibabel asks ``tell()`` and seeks to where it is
    already (or forward, writing zeros, when seeking raises ``OSError``)."""

    def __init__(self, stream):
        super().__init__()
        self._stream = stream
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._stream.write(data)
        n = memoryview(data).nbytes
        self._position += n
        return n

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._position + offset}.get(whence)
        if target != self._position:
            raise OSError("a gzip stream being written cannot seek")
        return self._position

    def flush(self) -> None:
        if not self.closed:
            self._stream.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes first
            finally:
                self._stream.close()


class _InflatingReader(io.RawIOBase):
    """A gzip file read front to back through ISA-L's inflate, in large blocks.

    Seeks forward by inflating and dropping, backward by starting again (nibabel reads the
    header, then seeks to the data once). Concatenated gzip members are read in turn; a
    truncated file gives the data before the cut, then :class:`EOFError` (as ``gzip`` does)."""

    BLOCK = 1 << 20

    def __init__(self, filename, isal_zlib):
        super().__init__()
        self._zlib = isal_zlib
        self._file = open(filename, "rb")
        self._start()

    def _start(self) -> None:
        self._file.seek(0)
        self._inflate = self._zlib.decompressobj(31)  # 16 + 15: a gzip header and trailer
        self._pending = b""
        self._position = 0
        self._finished = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def _more(self) -> bytes:
        """The next inflated bytes; b"" at the end of the last member."""
        while not self._finished:
            if self._inflate.eof:
                rest = self._inflate.unused_data
                if not rest:
                    rest = self._file.read(self.BLOCK)
                if not rest.strip(b"\0"):  # end of file (or zero padding after the last member)
                    self._finished = True
                    return b""
                self._inflate = self._zlib.decompressobj(31)
            else:
                rest = self._inflate.unconsumed_tail or self._file.read(self.BLOCK)
                if not rest:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            out = self._inflate.decompress(rest, 4 * self.BLOCK)
            if out:
                return out
        return b""

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` whole (short only at the end of the data, or before a cut in it)."""
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            if not self._pending:
                try:
                    self._pending = self._more()
                except EOFError:
                    if filled:
                        break  # the bytes before the cut now, the error on the next read
                    raise
                if not self._pending:
                    break
            n = min(len(view) - filled, len(self._pending))
            view[filled : filled + n] = self._pending[:n]
            self._pending = self._pending[n:]
            filled += n
        self._position += filled
        return filled

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._position + offset}.get(whence)
        if target is None or target < 0:  # UnsupportedOperation: nibabel then reads instead of mapping
            raise io.UnsupportedOperation("a gzip stream can only seek from its start or its current position")
        if target < self._position:
            self._start()
        while self._position < target:
            chunk = self.read(min(target - self._position, 4 * self.BLOCK))
            if not chunk:
                break
        return self._position

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()
            finally:
                self._file.close()


def _threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WRITE_THREADS, cores))


def gzip_open(
    filename: str, mode: str = "rb", compresslevel: int = 9, mtime: int = 0, keep_open: bool = False
) -> io.IOBase:
    """Open a gzip file as nibabel's ``gzip_open`` does (same arguments), through ISA-L when it can.

    Reading inflates in large blocks (seeking forward only cheaply); writing compresses on up to
    :data:`MAX_WRITE_THREADS` threads, with a zero modification time like nibabel's
    deterministic writer. Without ISA-L this is nibabel's own opener."""
    modules = _isal() if fast_gzip_enabled() else None
    if modules is None or mode not in ("rb", "wb", "r", "w"):
        return nibabel_gzip_open(filename, mode, compresslevel=compresslevel, mtime=mtime, keep_open=keep_open)
    isal_zlib, igzip_threaded = modules
    if "r" in mode:
        return _InflatingReader(filename, isal_zlib)
    level = _ISAL_LEVEL.get(int(compresslevel), 1)
    return _PositionedWriter(igzip_threaded.open(filename, "wb", compresslevel=level, threads=_threads()))


_NIBABEL_DEF = openers.ImageOpener.compress_ext_map[".gz"]
_OUR_DEF = (gzip_open, ("mode", "compresslevel", "mtime", "keep_open"))


def install(enabled: bool = True) -> None:
    """Make nibabel open ``.gz`` images with :func:`gzip_open` (or, ``enabled=False``, its own)."""
    openers.ImageOpener.compress_ext_map[".gz"] = _OUR_DEF if enabled else _NIBABEL_DEF
