""".trk and .tck written as they grow, for :class:`~.tractogram_stream.TractogramWriter`.

nibabel writes each part into a buffer; its streamline records are appended to the file, and the
header (streamline count; a .tck's content timestamp) is written at close, so the file has the
same bytes as :func:`~.tractogram.save_tractogram` of the whole. A .tck's scalars grow in their
side files (``.tsf`` per point, text per streamline; :mod:`.tractogram_tsf`) beside it.
"""

from __future__ import annotations

import io
import warnings

import nibabel as nib
import numpy as np
from nibabel.streamlines.trk import header_2_dtype as TRK_FIELDS

from ..model import Tractogram
from ._atomic import atomic_path
from .tractogram import nib_tractogram_mm, tck_scalar_columns, trk_header
from .tractogram_tsf import EMPTY_TIMESTAMP, content_timestamp, points_crc, sidecar_paths, tsf_body, tsf_header

__all__ = ["NibabelParts"]


class NibabelParts:
    """.trk/.tck: nibabel writes each part into a buffer; its records go to the file."""

    def __init__(self, writer):
        self.writer = writer
        self.trk = writer.suffix == ".trk"
        header = trk_header(writer.affine, writer.dimensions) if self.trk else {"timestamp": EMPTY_TIMESTAMP}
        self.kwargs = {"header": header}
        self.crc = 0  # .tck: of the positions, for the content timestamp
        self.sidecars: dict[str, tuple] = {}  # .tck: name -> (open file, kind) of the scalars' side files
        self.empty = self._encode(np.zeros((0, 3), np.float32), np.zeros(1, np.int64), {}, {})
        # .tck: header, records, then an end marker (a row of inf); .trk: header, records
        self.header_size = TRK_FIELDS.itemsize if self.trk else len(self.empty) - self._tail
        self.header = self.empty[: self.header_size]
        self.file = open(writer.tmp, "wb")
        self.file.write(bytes(self.header_size))

    @property
    def _tail(self) -> int:
        return 0 if self.trk else nib.streamlines.TckFile.EOF_DELIMITER.nbytes

    def _encode(self, points_mm, offsets, point_scalars, streamline_scalars) -> bytes:
        tract = nib_tractogram_mm(points_mm, offsets, point_scalars, streamline_scalars)
        buffer = io.BytesIO()
        cls = nib.streamlines.TrkFile if self.trk else nib.streamlines.TckFile
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(tract, **self.kwargs).save(buffer)
        return buffer.getvalue()

    def append(self, part: Tractogram) -> None:
        keep = self.writer.keep_scalars and self.trk
        world = self.writer.world_of(part)
        point_scalars, streamline_scalars = (part.point_scalars, part.streamline_scalars) if keep else ({}, {})
        if self.trk and not len(world):  # nibabel's .trk writer divides by the point count
            data = self._pointless_records(point_scalars, streamline_scalars, len(part))
        else:
            data = self._encode(world, part.offsets, point_scalars, streamline_scalars)
        if not self.trk:
            self.crc = points_crc(world, self.crc)
            if self.writer.keep_scalars:
                self._append_sidecars(part)
        if self.writer.streamlines == 0 and self.trk:
            self.header = data[: self.header_size]  # the scalar and property names of the parts
        self.file.write(memoryview(data)[self.header_size : len(data) - self._tail])

    def _pointless_records(self, point_scalars, streamline_scalars, count: int) -> bytes:
        """A .trk header and the records of ``count`` streamlines without points: each its point
        count (0) and its properties. The header (the scalars' and properties' names) is
        nibabel's for one streamline of one point with the same names."""
        one_point = {name: np.zeros((1, *np.shape(values)[1:]), np.float32) for name, values in point_scalars.items()}
        first = {name: np.asarray(values, np.float32)[:1] for name, values in streamline_scalars.items()}
        header = self._encode(np.zeros((1, 3), np.float32), np.array([0, 1]), one_point, first)[: self.header_size]
        columns = [np.asarray(v, np.float32).reshape(count, -1) for v in streamline_scalars.values()]
        records = np.zeros(count, [("points", "<i4"), ("properties", "<f4", (sum(c.shape[1] for c in columns),))])
        if columns:
            records["properties"] = np.concatenate(columns, axis=1)
        return header + records.tobytes()

    def _append_sidecars(self, part: Tractogram) -> None:
        """A part's scalars appended to their .tsf / text files (opened at the first part)."""
        point = tck_scalar_columns(part.point_scalars)
        streamline = tck_scalar_columns(part.streamline_scalars)
        if not self.sidecars:
            for name, path in sidecar_paths(self.writer.path, point, streamline).items():
                tmp = self.writer._stack.enter_context(atomic_path(path))
                handle = self.writer._stack.enter_context(open(tmp, "wb"))
                kind = "tsf" if name in point else "txt"
                if kind == "tsf":
                    handle.write(tsf_header(0, EMPTY_TIMESTAMP))  # placeholder, rewritten at close
                self.sidecars[name] = (handle, kind)
        offsets = np.asarray(part.offsets) - part.offsets[0]
        for name, values in point.items():
            self.sidecars[name][0].write(tsf_body(values, offsets, last=False))
        for name, values in streamline.items():
            self.sidecars[name][0].write(b"".join(b"%.9g\n" % v for v in np.asarray(values, np.float64)))

    def _finish_sidecars(self, count: int, timestamp: str) -> None:
        for handle, kind in self.sidecars.values():
            if kind == "tsf":
                handle.write(np.array([np.inf], "<f4").tobytes())
                handle.seek(0)
                handle.write(tsf_header(count, timestamp))
            handle.flush()

    def finish(self) -> None:
        count = self.writer.streamlines
        if not self.trk:
            timestamp = content_timestamp(count, self.crc)
            self._finish_sidecars(count, timestamp)
            if count:
                self.header = self.header.replace(
                    b"timestamp: " + EMPTY_TIMESTAMP.encode(), b"timestamp: " + timestamp.encode()
                )
        if count == 0:
            self.file.seek(0)
            self.file.truncate()
            self.file.write(self.empty)
        else:
            self.file.write(self.empty[len(self.empty) - self._tail :])
            self.file.seek(0)
            self.file.write(self._header_with(count))
        self.file.close()

    def _header_with(self, count: int) -> bytes:
        if self.trk:
            header = np.frombuffer(self.header, dtype=TRK_FIELDS).copy()
            header[nib.streamlines.Field.NB_STREAMLINES] = count
            return header.tobytes()
        old, new = b"count: %010d" % 0, b"count: %010d" % count
        if len(new) != len(old) or self.header.count(old) != 1:
            raise ValueError(f"{self.writer.path}: too many streamlines for a .tck header ({count})")
        return self.header.replace(old, new)

    def discard(self) -> None:
        self.file.close()
