"""The .trx writer's own ZIP of STORED members (app.io._zip_stored): what it writes is what
zipfile reads, CRCs checked, with and without ZIP64 fields, copied by the kernel or by blocks."""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np
import pytest

from tractlens.app.io import _zip_stored
from tractlens.app.io._zip_stored import StoredZip, crc32


def _members(rng) -> dict[str, bytes]:
    return {
        "positions.3.float32": rng.random(3 * 1000, dtype=np.float32).tobytes(),
        "offsets.uint32": np.arange(0, 1001, 7, dtype="<u4").tobytes(),
        "dpv/fa.float32": rng.random(1000, dtype=np.float32).tobytes(),
        "empty": b"",
        "header.json": b'{"NB_STREAMLINES": 143}',
    }


def _write(path, members: dict[str, bytes], folder) -> None:
    """positions grown in pieces, offsets and FA copied from files (their CRCs given), the rest whole."""
    zip_ = StoredZip(path)
    zip_.begin("positions.3.float32")
    data = members["positions.3.float32"]
    for a, b in ((0, 5), (5, 5), (5, 4096), (4096, len(data))):  # an empty piece too
        zip_.write(memoryview(data)[a:b])
    zip_.end()
    for name in ("offsets.uint32", "dpv/fa.float32"):
        source = folder / name.replace("/", "_")
        source.write_bytes(members[name])
        zip_.copy(name, source, zlib.crc32(members[name]))
    zip_.add("empty", members["empty"])
    zip_.add("header.json", members["header.json"])
    zip_.close()


def _check(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == list(members)  # in the order written
        assert z.testzip() is None  # every CRC matches the bytes
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            assert info.file_size == len(members[info.filename])
            assert z.read(info) == members[info.filename]


def test_members_grown_copied_and_whole_read_back_with_their_crcs(tmp_path):
    members = _members(np.random.default_rng(1))
    _write(tmp_path / "a.zip", members, tmp_path)
    _check(tmp_path / "a.zip", members)
    with zipfile.ZipFile(tmp_path / "a.zip") as z:  # the member grown has ZIP64 sizes in its
        info = z.getinfo("positions.3.float32")  # local header (its size was not known), as
        local = (tmp_path / "a.zip").read_bytes()[info.header_offset :]  # zipfile's force_zip64
        assert local[18:26] == b"\xff" * 8 and local[4] == 45
        assert z.getinfo("header.json").header_offset > info.header_offset


def test_zip64_fields_and_end_records_read_back(tmp_path, monkeypatch):
    """With the limits lowered, sizes, offsets and the member count go into the ZIP64 fields and
    end records, as a whole-brain .trx (over 4 GiB) needs; zipfile takes them from there."""
    monkeypatch.setattr(_zip_stored, "LIMIT", 1000)
    monkeypatch.setattr(_zip_stored, "MEMBER_LIMIT", 3)
    members = _members(np.random.default_rng(2))
    _write(tmp_path / "wide.zip", members, tmp_path)
    _check(tmp_path / "wide.zip", members)
    raw = (tmp_path / "wide.zip").read_bytes()
    assert raw[-22:-18] == b"PK\x05\x06" and raw[-42:-38] == b"PK\x06\x07"  # locator before the end
    assert raw[-14:-10] == b"\xff" * 4 and raw[-6:-2] == b"\xff" * 4  # its counts and the directory's
    assert raw[-10:-6] != b"\xff" * 4  # offset point onwards; the directory's size fits
    with zipfile.ZipFile(tmp_path / "wide.zip") as z:
        assert z.getinfo("header.json").header_offset > 1000  # read from the ZIP64 extra field


def test_small_zips_need_no_zip64_end_records(tmp_path):
    members = _members(np.random.default_rng(3))
    _write(tmp_path / "a.zip", members, tmp_path)
    raw = (tmp_path / "a.zip").read_bytes()
    assert raw[-22:-18] == b"PK\x05\x06" and b"PK\x06\x07" not in raw[-64:]


def test_copies_by_blocks_where_the_kernel_does_not(tmp_path, monkeypatch):
    """``copy_file_range`` refused (another file system): the bytes go through one small buffer,
    every partial block kept; a copy the kernel stops half-way is finished by blocks."""
    members = _members(np.random.default_rng(4))
    monkeypatch.setattr(_zip_stored, "_COPY_BLOCK", 7)
    calls = []

    def refused(*args):
        calls.append(args)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    _write(tmp_path / "blocks.zip", members, tmp_path)
    _check(tmp_path / "blocks.zip", members)
    assert len(calls) == 2

    def half(source, target, count, offset_source, offset_target):  # 100 bytes, then nothing more
        if offset_source:
            return 0
        return os.pwrite(target, os.pread(source, min(count, 100), 0), offset_target)

    monkeypatch.setattr(os, "copy_file_range", half, raising=False)
    _write(tmp_path / "half.zip", members, tmp_path)
    _check(tmp_path / "half.zip", members)


def test_misuse_is_refused(tmp_path):
    zip_ = StoredZip(tmp_path / "a.zip")
    with pytest.raises(ValueError, match="no member is open"):
        zip_.write(b"x")
    zip_.begin("a")
    with pytest.raises(ValueError, match="'a' is still open"):
        zip_.add("b", b"")
    zip_.write(b"abc")
    zip_.close()  # ends the open member
    with pytest.raises(ValueError, match="closed"):
        zip_.add("c", b"")
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert z.read("a") == b"abc"


def test_discard_closes_the_file(tmp_path):
    zip_ = StoredZip(tmp_path / "a.zip")
    zip_.begin("a")
    zip_.write(b"abc")
    zip_.discard()
    with pytest.raises(OSError):
        os.fstat(zip_.fileno())
    zip_.discard()  # twice is harmless


@pytest.mark.parametrize("size", [0, 1, 5000, 1 << 20])
def test_crc32_is_zlibs(size):
    """ISA-L's CRC (the fast-io extra, which the test extra installs) equals zlib's, chained too."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert crc32(data) == zlib.crc32(data)
    half = size // 2
    assert crc32(data[half:], crc32(data[:half])) == zlib.crc32(data)


def test_crc32_is_isal_when_installed():
    from isal import isal_zlib  # the fast-io extra, in the test extra

    assert _zip_stored._crc32_function() is isal_zlib.crc32


def test_a_streamed_trx_with_zip64_fields_loads_in_trx_python_and_here(tmp_path, monkeypatch):
    """trx-python maps each member from its local header (whose ZIP64 extra field a member
    grown as it was written has): a .trx whose every size and offset needs the ZIP64 fields
    loads with the streamlines, offsets and scalars written, there and in TractLens."""
    from trx.trx_file_memmap import load as trx_load

    from tractlens.app.io.tractogram_mapped import open_trx_mm
    from tractlens.app.io.tractogram_stream import open_tractogram_writer
    from tractlens.app.model import Tractogram

    monkeypatch.setattr(_zip_stored, "LIMIT", 64)
    monkeypatch.setattr(_zip_stored, "MEMBER_LIMIT", 2)
    rng = np.random.default_rng(6)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(2, 30, 200))])
    affine = np.diag([1.25, 1.25, 1.25, 1.0])
    tract = Tractogram(
        (rng.random((offsets[-1], 3)) * 100).astype(np.float32), offsets, affine, (80, 90, 70),
        {"fa": rng.random(offsets[-1]).astype(np.float32)},
    )  # fmt: skip
    path = tmp_path / "wide.trx"
    with open_tractogram_writer(path, affine, tract.dimensions) as writer:
        for a, b in ((0, 70), (70, 200)):
            writer.append(tract.subset(np.arange(a, b)))
    world = tract.points.astype(np.float64) @ affine[:3, :3].T + affine[:3, 3]
    trx = trx_load(str(path))
    try:
        assert np.allclose(trx.streamlines._data, world, atol=1e-4)
        assert np.array_equal(trx.streamlines._offsets, offsets[:-1])
        assert np.array_equal(np.asarray(trx.data_per_vertex["fa"]._data).ravel(), tract.point_scalars["fa"])
    finally:
        trx.close()
    mapped = open_trx_mm(path)
    assert np.allclose(mapped.points, world, atol=1e-4) and np.array_equal(mapped.offsets, offsets)
    assert np.array_equal(mapped.point_scalars["fa"], tract.point_scalars["fa"])


def test_names_beyond_ascii_are_utf8_and_say_so(tmp_path):
    """A scalar's name may hold any character: written as UTF-8 with the flag that says so (as
    zipfile does), plain ASCII names without it."""
    source = tmp_path / "side"
    source.write_bytes(b"\x01\x02")
    zip_ = StoredZip(tmp_path / "a.zip")
    zip_.add("dpv/größe.float32", b"abc")
    zip_.copy("dps/länge.float32", source, zlib.crc32(b"\x01\x02"))
    zip_.begin("positions.3.float32")
    zip_.write(np.zeros((0, 3), np.float32).data)  # a part with streamlines but no points
    zip_.end()
    zip_.close()
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert z.testzip() is None
        assert z.namelist() == ["dpv/größe.float32", "dps/länge.float32", "positions.3.float32"]
        assert [info.flag_bits & 0x800 for info in z.infolist()] == [0x800, 0x800, 0]
        assert z.read("dpv/größe.float32") == b"abc" and z.read("positions.3.float32") == b""
    raw = (tmp_path / "a.zip").read_bytes()
    assert raw[6:8] == (0x800).to_bytes(2, "little")  # the local header says it too
