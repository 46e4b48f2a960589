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
        from isal import igzip, igzip_threaded
    except Exception as exc:  # ImportError, or a wheel built for another CPU
        log.debug("python-isal not usable (%s): gzip through the standard library", exc)
        return None
    return igzip, igzip_threaded


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

    Reading gives a seekable file (``isal.igzip``); writing compresses on up to
    :data:`MAX_WRITE_THREADS` threads, with a zero modification time like nibabel's
    deterministic writer. Without ISA-L this is nibabel's own opener."""
    modules = _isal() if fast_gzip_enabled() else None
    if modules is None or mode not in ("rb", "wb", "r", "w"):
        return nibabel_gzip_open(filename, mode, compresslevel=compresslevel, mtime=mtime, keep_open=keep_open)
    igzip, igzip_threaded = modules
    if "r" in mode:
        return igzip.open(filename, "rb")
    level = _ISAL_LEVEL.get(int(compresslevel), 1)
    return _PositionedWriter(igzip_threaded.open(filename, "wb", compresslevel=level, threads=_threads()))


_NIBABEL_DEF = openers.ImageOpener.compress_ext_map[".gz"]
_OUR_DEF = (gzip_open, ("mode", "compresslevel", "mtime", "keep_open"))


def install(enabled: bool = True) -> None:
    """Make nibabel open ``.gz`` images with :func:`gzip_open` (or, ``enabled=False``, its own)."""
    openers.ImageOpener.compress_ext_map[".gz"] = _OUR_DEF if enabled else _NIBABEL_DEF
