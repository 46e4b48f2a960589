"""Scalars of a ``.tck`` tractogram in MRtrix's side files: ``.tsf`` per point, text per streamline.

A ``.tck`` holds positions only. MRtrix keeps a value per point in a *track scalar file*
(``.tsf``, written by ``tcksample``, read by ``tsfinfo``, ``tsfvalidate``, ``mrview``): the same
text header as the ``.tck`` (first line ``mrtrix track scalars``, ``key: value`` lines, ``file: .
OFFSET``, ``END``), then float32 values in the order of the points, a NaN after each streamline
and an Inf at the end. MRtrix pairs the two files by their ``timestamp`` (they must match), and
by ``count``. A value per streamline is a plain text file, one number per line (as
``tcksift2`` writes its weights).

Beside ``NAME.tck``, the scalar ``fa`` is ``NAME_fa.tsf`` and the per-streamline ``length_mm``
``NAME_length_mm.txt``. TractLens stamps every ``.tck`` it writes with a ``timestamp`` made from
its content (count and a CRC-32 of the float32 positions) rather than the clock, so the same
streamlines give the same bytes however they were written (at once or streamed part by part).
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from pathlib import Path

import numpy as np

from ..errors import InputError
from ._atomic import atomic_path

TSF_MAGIC = b"mrtrix track scalars"
#: ``timestamp`` of an empty .tck (no points); the width of every timestamp written.
EMPTY_TIMESTAMP = "0000000000.0000000000"
_FIX = "Write it again (e.g. with tcksample), or remove it: the tractogram is read without it"


def content_timestamp(count: int, crc: int) -> str:
    """The ``timestamp`` of a .tck: ``COUNT.CRC`` zero-padded to a fixed width (21 characters)."""
    return f"{int(count) % 10**10:010d}.{int(crc) & 0xFFFFFFFF:010d}"


def points_crc(points_mm_float32: np.ndarray, crc: int = 0) -> int:
    """CRC-32 of float32 positions (continued from ``crc``), as written to the file."""
    return zlib.crc32(np.ascontiguousarray(points_mm_float32, dtype="<f4").data, crc)


def sidecar_paths(tck: str | os.PathLike, point_names, streamline_names) -> dict[str, Path]:
    """``{name: path}`` of the side files of ``tck``'s scalars (``NAME_fa.tsf``, ``NAME_length_mm.txt``)."""
    tck = Path(tck)
    stem = tck.name[: -len(tck.suffix)] if tck.suffix else tck.name
    paths = {name: tck.with_name(f"{stem}_{name}.tsf") for name in point_names}
    paths.update({name: tck.with_name(f"{stem}_{name}.txt") for name in streamline_names})
    return paths


def tsf_header(count: int, timestamp: str) -> bytes:
    """The text header of a .tsf: fixed width for a given timestamp width (the count has 10 digits)."""
    lines = [TSF_MAGIC, b"count: %010d" % count, b"datatype: Float32LE", b"timestamp: " + timestamp.encode()]
    head = b"\n".join(lines) + b"\nfile: . "
    # the offset's own digits are part of the header: find the fixed point
    for width in range(1, 12):
        offset = len(head) + width + len(b"\nEND\n")
        if len(str(offset)) == width:
            return head + str(offset).encode() + b"\nEND\n"
    raise AssertionError("unreachable")


def tsf_body(values: np.ndarray, offsets: np.ndarray, *, last: bool = True) -> bytes:
    """The values of streamlines ``offsets`` as a .tsf stores them: a NaN after each, an Inf at the end."""
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    offsets = np.asarray(offsets, dtype=np.int64)
    n, p = len(offsets) - 1, int(offsets[-1] - offsets[0])
    if values.shape != (p,):
        raise ValueError(f"{p} points but {values.size} values")
    out = np.full(p + n + int(last), np.nan, dtype="<f4")
    lengths = np.diff(offsets)
    out[np.arange(p) + np.repeat(np.arange(n), lengths)] = values
    if last:
        out[-1] = np.inf
    return out.tobytes()


def write_tsf(path: str | os.PathLike, values: np.ndarray, offsets: np.ndarray, timestamp: str) -> Path:
    """Write a .tsf of per-point ``values`` of the streamlines ``offsets``, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(tsf_header(len(offsets) - 1, timestamp))
        handle.write(tsf_body(values, offsets))
    return path


def write_streamline_values(path: str | os.PathLike, values: np.ndarray) -> Path:
    """One number per line (tcksift2's weights format), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        np.savetxt(tmp, np.asarray(values, dtype=np.float64).reshape(-1), fmt="%.9g")
    return path


def read_mrtrix_header(path: Path, magic: bytes) -> tuple[dict[str, str], int]:
    """The ``key: value`` lines of an MRtrix track or scalar file and its data offset."""
    with open(path, "rb") as handle:
        head = handle.read(65536)
    if not head.startswith(magic + b"\n"):
        raise InputError(f"not an MRtrix file (its first line is not '{magic.decode()}')", path=path, fix=_FIX)
    end = head.find(b"\nEND\n")
    if end < 0:
        raise InputError("the header has no END line", path=path, fix=_FIX)
    fields: dict[str, str] = {}
    for line in head[len(magic) + 1 : end].decode("utf-8", "replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    match = re.fullmatch(r"\.\s+(\d+)", fields.get("file", ""))
    if match is None:
        raise InputError("the header's 'file' entry is not '. OFFSET' (one file)", path=path, fix=_FIX)
    return fields, int(match.group(1))


def read_tsf(path: str | os.PathLike, offsets: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, str]]:
    """Per-point values of a .tsf (``(P,)`` float32) and its header; with ``offsets``, checked
    against the streamlines they belong to (their number and each one's points)."""
    path = Path(path)
    fields, offset = read_mrtrix_header(path, TSF_MAGIC)
    kind = fields.get("datatype", "")
    if kind not in ("Float32LE", "Float32BE", "Float64LE", "Float64BE"):
        raise InputError(f"unsupported datatype {kind!r} (MRtrix writes Float32LE)", path=path, fix=_FIX)
    dtype = np.dtype(("<" if kind.endswith("LE") else ">") + ("f4" if "32" in kind else "f8"))
    data = np.fromfile(path, dtype=dtype, offset=offset)
    ends = np.flatnonzero(np.isinf(data))
    data = data[: ends[0]] if len(ends) else data
    delimiters = np.isnan(data)
    values = data[~delimiters].astype(np.float32)
    lengths = np.diff(np.concatenate([[-1], np.flatnonzero(delimiters)])) - 1
    if offsets is not None:
        expected = np.diff(np.asarray(offsets, dtype=np.int64))
        if len(lengths) != len(expected) or not np.array_equal(lengths, expected):
            raise InputError(
                f"holds values for {len(lengths)} streamlines ({values.size} points), the tractogram has "
                f"{len(expected)} ({int(expected.sum())} points): it belongs to another tractogram",
                path=path,
                fix=_FIX,
            )
    return values, fields


def read_streamline_values(path: str | os.PathLike, count: int | None = None) -> np.ndarray:
    """A text file of one number per streamline (tcksift2's weights), checked against ``count``."""
    path = Path(path)
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=1, comments="#")
    except ValueError as exc:
        raise InputError(f"is not one number per line ({exc})", path=path, fix=_FIX) from None
    if values.ndim != 1 or (count is not None and len(values) != count):
        raise InputError(f"holds {values.size} values, the tractogram has {count} streamlines", path=path, fix=_FIX)
    return values


def read_sidecars(tck: Path, offsets: np.ndarray, timestamp: str | None) -> tuple[dict, dict]:
    """The scalars beside ``tck`` that belong to it: ``NAME_*.tsf`` whose timestamp and count
    match (others are skipped), and ``NAME_*.txt`` with one value per streamline."""

    log = logging.getLogger(__name__)
    stem = tck.name[: -len(tck.suffix)]
    point, per_streamline = {}, {}
    count = len(offsets) - 1
    for path in sorted(tck.parent.glob(f"{glob_escape(stem)}_*.tsf")):
        name = path.name[len(stem) + 1 : -len(".tsf")]
        try:
            values, fields = read_tsf(path, offsets)
        except InputError as exc:
            log.warning("%s: not read with the tractogram: %s", path, exc)
            continue
        if timestamp is not None and fields.get("timestamp") != timestamp:
            log.warning("%s: its timestamp differs from %s's: it belongs to another tractogram; not read", path, tck)
            continue
        point[name] = values
    for path in sorted(tck.parent.glob(f"{glob_escape(stem)}_*.txt")):
        name = path.name[len(stem) + 1 : -len(".txt")]
        try:
            per_streamline[name] = read_streamline_values(path, count)
        except InputError as exc:
            log.warning("%s: not read with the tractogram: %s", path, exc)
    return point, per_streamline


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)
