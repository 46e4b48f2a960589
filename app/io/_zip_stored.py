"""A ZIP file of STORED (uncompressed) members written as they grow, for the .trx writer.

The standard library's :class:`zipfile.ZipFile` writes a member through one buffered stream,
computing the CRC-32 inline with zlib's (about 4 GB/s on one core) and copying every byte of a
member that comes from another file through user space. A whole-brain .trx is 5 GB a subject,
written while the GPU tracks the next batch; the writer's thread is the tracking step's
longest part in a cohort. This writer is the same format with three differences:

- the CRC is ISA-L's (:mod:`isal.isal_zlib`, the ``fast-io`` extra; three to six times zlib's
  speed on the machines measured) where it is installed, else zlib's;
- a member whose bytes already lie in a file (:meth:`StoredZip.copy`) is copied by the kernel
  (``copy_file_range``; a read/write loop where the call is missing or refused), its CRC given
  by whoever wrote the file: nothing reads it back;
- every write is positional (``pwrite``) at offsets the writer keeps, so the file needs no
  seeking and its descriptor can be handed to the system's write-back calls.

The layout is APPNOTE 6.3's: a local header before each member's bytes, then the central
directory and its end record. A member written as it grows (:meth:`StoredZip.begin`) has
ZIP64 sizes in its local header from the start, as :mod:`zipfile` writes with
``force_zip64=True``; its CRC and sizes are written into that header at :meth:`StoredZip.end`.
The central directory uses ZIP64 fields only where a size or offset needs them, and the ZIP64
end records only when the directory does. :mod:`zipfile`, ``unzip`` and trx-python read it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import time
import zlib

__all__ = ["StoredZip", "crc32"]

# APPNOTE 6.3: local file header, central directory header, ZIP64 end of central directory
# record and its locator, end of central directory record.
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<IQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_END = struct.Struct("<IHHHHIIH")
_ZIP64_EXTRA = 0x0001
#: The size or offset from which a 32-bit field says 0xFFFFFFFF and the value is in the ZIP64
#: extra field (the largest a 32-bit field holds; tests lower it to write small ZIP64 files).
LIMIT = 0xFFFFFFFF
#: The member count from which the end record says 0xFFFF and the ZIP64 end record counts.
MEMBER_LIMIT = 0xFFFF
_WIDE, _MANY = 0xFFFFFFFF, 0xFFFF  # "see the ZIP64 field"
_VERSION_ZIP64, _VERSION_PLAIN = 45, 20
_MADE_BY_UNIX = 3 << 8
_FILE_MODE = 0o100644 << 16  # a regular file, rw-r--r--, in the Unix external attributes
_UTF8_NAME = 0x0800  # general purpose flag bit 11: the name is UTF-8 (set only where it is not ASCII)
# The largest write Linux does in one call.
_MOST_PER_WRITE = 0x7FFFF000
# Block size of copying a file in where the kernel does not.
_COPY_BLOCK = 16 << 20


@functools.cache
def _crc32_function():
    try:
        from isal import isal_zlib
    except Exception:  # not installed, or a wheel built for another CPU
        return zlib.crc32
    return isal_zlib.crc32


def crc32(data, value: int = 0) -> int:
    """zlib's ``crc32(data, value)``, through ISA-L where python-isal is installed."""
    return _crc32_function()(data, value)


def _dos_time(seconds: float) -> tuple[int, int]:
    t = time.localtime(seconds)
    year = min(max(t.tm_year, 1980), 2107)
    return t.tm_hour << 11 | t.tm_min << 5 | t.tm_sec // 2, (year - 1980) << 9 | t.tm_mon << 5 | t.tm_mday


class StoredZip:
    """Write ``path`` (created or truncated) as a ZIP of STORED members, in the order given:
    :meth:`add` a whole member, :meth:`copy` one from a file, or :meth:`begin`, :meth:`write`
    its bytes and :meth:`end` it; then :meth:`close` (the central directory). :meth:`discard`
    leaves the file unfinished (its caller removes it). ``fileno()``/``tell()`` are the file's
    descriptor and its end so far, for :func:`os.posix_fadvise` and the like."""

    def __init__(self, path: str | os.PathLike):
        self._file = open(path, "wb", buffering=0)  # closed with the object if it is dropped unclosed
        self._fd = self._file.fileno()
        self._end = 0
        self._time = _dos_time(time.time())
        self._members: list[tuple[bytes, int, int, int, bool]] = []  # name, offset, size, crc, zip64 local
        self._open: tuple[bytes, int, int] | None = None  # the member begun: name, its header's offset, the CRC
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._end

    def flush(self) -> None:
        """Nothing to flush: every byte is written to the file when it is given."""

    def _write_at(self, data, offset: int) -> None:
        _write_all(self._fd, data, offset)

    def _append(self, data) -> None:
        self._write_at(data, self._end)
        self._end += memoryview(data).nbytes

    def _header(self, name: bytes, crc: int, size: int, zip64: bool) -> bytes:
        sizes = _WIDE if zip64 else size
        extra = struct.pack("<HHQQ", _ZIP64_EXTRA, 16, size, size) if zip64 else b""
        version = _VERSION_ZIP64 if zip64 else _VERSION_PLAIN
        fields = (0x04034B50, version, _flags(name), 0, *self._time, crc, sizes, sizes, len(name), len(extra))
        return _LOCAL.pack(*fields) + name + extra

    def _check_free(self, name: str) -> bytes:
        if self._closed:
            raise ValueError("the zip is closed")
        if self._open is not None:
            raise ValueError(f"{name}: the member {self._open[0].decode()!r} is still open")
        return name.encode("utf-8")

    def add(self, name: str, data: bytes) -> None:
        """A member whose bytes are all here."""
        encoded = self._check_free(name)
        size, crc = len(data), crc32(data)
        zip64 = size >= LIMIT
        self._members.append((encoded, self._end, size, crc, zip64))
        self._append(self._header(encoded, crc, size, zip64))
        self._append(data)

    def copy(self, name: str, source: str | os.PathLike, crc: int) -> None:
        """A member with the bytes of the file ``source``, whose CRC-32 its writer gives."""
        encoded = self._check_free(name)
        size = os.path.getsize(source)
        zip64 = size >= LIMIT
        self._members.append((encoded, self._end, size, crc, zip64))
        self._append(self._header(encoded, crc, size, zip64))
        with open(source, "rb", buffering=0) as file:
            _copy_file(file, self._fd, size, self._end)
        self._end += size

    def begin(self, name: str) -> None:
        """Start a member whose bytes come by :meth:`write` until :meth:`end`."""
        encoded = self._check_free(name)
        self._open = (encoded, self._end, 0)
        self._append(self._header(encoded, 0, 0, zip64=True))

    def write(self, data) -> None:
        """Append ``data`` (any contiguous buffer) to the open member."""
        if self._open is None:
            raise ValueError("no member is open")
        name, offset, crc = self._open
        self._open = (name, offset, crc32(data, crc))
        self._append(data)

    def end(self) -> None:
        """Finish the open member: its CRC and sizes into its local header."""
        if self._open is None:
            raise ValueError("no member is open")
        name, offset, crc = self._open
        size = self._end - offset - _LOCAL.size - len(name) - 20
        self._write_at(self._header(name, crc, size, zip64=True), offset)
        self._members.append((name, offset, size, crc, True))
        self._open = None

    def close(self) -> None:
        """Write the central directory and the end records, and close the file."""
        if self._closed:
            return
        if self._open is not None:
            self.end()
        start = self._end
        for name, offset, size, crc, zip64_local in self._members:
            self._append(self._central(name, offset, size, crc, zip64_local))
        count, size = len(self._members), self._end - start
        if count >= MEMBER_LIMIT or start >= LIMIT or size >= LIMIT:
            record = self._end
            made = _MADE_BY_UNIX | _VERSION_ZIP64
            self._append(_ZIP64_END.pack(0x06064B50, 44, made, _VERSION_ZIP64, 0, 0, count, count, size, start))
            self._append(_ZIP64_LOCATOR.pack(0x07064B50, 0, record, 1))
        counted = _MANY if count >= MEMBER_LIMIT else count
        size32, start32 = (_WIDE if v >= LIMIT else v for v in (size, start))
        self._append(_END.pack(0x06054B50, 0, 0, counted, counted, size32, start32, 0))
        self._closed = True
        self._file.close()

    def _central(self, name: bytes, offset: int, size: int, crc: int, zip64_local: bool) -> bytes:
        wide = [value for value in (size, size, offset) if value >= LIMIT]
        extra = struct.pack(f"<HH{len(wide)}Q", _ZIP64_EXTRA, 8 * len(wide), *wide) if wide else b""
        version = _VERSION_ZIP64 if wide or zip64_local else _VERSION_PLAIN
        size32, offset32 = (_WIDE if v >= LIMIT else v for v in (size, offset))
        return _CENTRAL.pack(
            0x02014B50, _MADE_BY_UNIX | version, version, _flags(name), 0, *self._time, crc, size32, size32,
            len(name), len(extra), 0, 0, 0, _FILE_MODE, offset32,
        ) + name + extra  # fmt: skip

    def discard(self) -> None:
        """Close the file as it is (its caller removes it)."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self._file.close()


def _flags(name: bytes) -> int:
    return 0 if name.isascii() else _UTF8_NAME


def _write_all(fd: int, data, offset: int) -> None:
    """All of ``data`` into ``fd`` at ``offset`` (``pwrite``; a seek and a write where there is none)."""
    view = memoryview(data)
    if not view.nbytes:  # (also: a view with a zero in its shape cannot be cast to bytes)
        return
    view = view.cast("B")
    while view:
        chunk = view[:_MOST_PER_WRITE]
        if hasattr(os, "pwrite"):
            done = os.pwrite(fd, chunk, offset)
        else:  # Windows
            os.lseek(fd, offset, os.SEEK_SET)
            done = os.write(fd, chunk)
        if done <= 0:
            raise OSError(f"the system wrote none of {len(view)} bytes")
        view, offset = view[done:], offset + done


def _copy_file(source, target: int, size: int, offset: int) -> None:
    """The first ``size`` bytes of the open file ``source`` into ``target`` at ``offset``: in the
    kernel where it can (``copy_file_range``: no copy through this process), else by blocks."""
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        with contextlib.suppress(OSError):  # another file system, or a kernel without it
            while done < size:
                step = copy_range(source.fileno(), target, min(size - done, _MOST_PER_WRITE), done, offset + done)
                if step <= 0:
                    break
                done += step
    source.seek(done)
    block = memoryview(bytearray(min(_COPY_BLOCK, max(size - done, 1))))
    while done < size:
        got = source.readinto(block[: min(len(block), size - done)])
        if not got:
            raise OSError(f"the file ended {size - done} bytes early")
        _write_all(target, block[:got], offset + done)
        done += got
