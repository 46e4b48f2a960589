"""A memory-mapped .trx in a session or the autosave (issue 41): its positions are written as the
file stores them (float32, or float16), streamed from the file a chunk at a time (no whole copy,
no float64), atomically, and the reopened tractogram is mapped again and equal bit for bit."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests._mapped_files import file_rss
from tractlens.app.io import load_tractogram, save_tractogram, tractogram_exact
from tractlens.app.io.tractogram_stream import open_tractogram_writer
from tractlens.app.model import Document, Layer, Tractogram
from tractlens.app.recovery import AutoSaver, RecoveryStore
from tractlens.app.session import SessionFolder, load_session, save_session, snapshot

AFFINE = np.array([[-1.25, 0.02, 0, 90], [0.01, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])


def _tractogram(n=2000, points=40, seed=0) -> Tractogram:
    rng = np.random.default_rng(seed)
    steps = rng.normal(scale=0.4, size=(n * points, 3)).astype(np.float32)
    pts = (np.cumsum(steps.reshape(n, points, 3), axis=1) + 60).reshape(-1, 3)
    offsets = np.arange(0, n * points + 1, points, dtype=np.int64)
    return Tractogram(pts, offsets, AFFINE, (145, 174, 145),
                      {"fa": rng.random(n * points).astype(np.float32)},
                      {"weight": rng.random(n).astype(np.float32)})  # fmt: skip


def _trx(tmp_path: Path, dtype: str, n=2000, points=40) -> Path:
    """A .trx of ``dtype`` positions as TractLens writes it (the streamed writer)."""
    tract = _tractogram(n, points)
    path = tmp_path / f"source_{dtype}.trx"
    with open_tractogram_writer(path, tract.affine, tract.dimensions, positions_dtype=dtype) as writer:
        writer.append(tract)
    return path


def _document(tract: Tractogram) -> Document:
    doc = Document()
    layer = Layer("fibres", tract, "tractogram")
    doc.add_layer(layer)
    layer.selection = np.arange(len(tract)) % 3 == 0
    return doc


def _assert_same(reopened: Tractogram, original: Tractogram) -> None:
    assert reopened.mapped is not None, "reopened memory-mapped, as the original"
    world, before = np.asarray(reopened.mapped.reader[:]), np.asarray(original.mapped.reader[:])
    assert world.dtype == before.dtype  # the file's own dtype, not float64
    np.testing.assert_array_equal(world.view(np.uint8), before.view(np.uint8))  # the file's bytes
    np.testing.assert_array_equal(reopened.affine, original.affine)
    np.testing.assert_array_equal(reopened.offsets, original.offsets)
    index = np.array([0, 7, 1234, 40_000 - 1, 555])
    np.testing.assert_array_equal(reopened.points_take(index), original.points_take(index))
    np.testing.assert_array_equal(reopened.points, original.points)  # bit for bit
    for mine, theirs in ((reopened.point_scalars, original.point_scalars),
                         (reopened.streamline_scalars, original.streamline_scalars)):  # fmt: skip
        assert set(mine) == set(theirs)
        for key in mine:
            assert np.asarray(mine[key]).dtype == np.asarray(theirs[key]).dtype
            np.testing.assert_array_equal(np.asarray(mine[key]), np.asarray(theirs[key]))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_autosaved_mapped_trx_reopens_bit_for_bit_in_its_own_dtype(tmp_path, dtype):
    original = load_tractogram(_trx(tmp_path, dtype))
    assert original.mapped is not None and original.mapped.world.dtype == np.dtype(dtype)
    doc = _document(original)
    store = RecoveryStore(tmp_path / "recovery").open()
    saver = AutoSaver(store, lambda: snapshot(doc))
    assert saver.tick() and saver.wait(60) and saver.writes == 1, saver.last_error
    assert not original.mapped.made  # written from the file's positions: no voxel coordinates made
    (written,) = (store.folder / "layers").glob("*_tractogram_*.trx")
    with zipfile.ZipFile(written) as archive:
        names = archive.namelist()
        assert f"positions.3.{dtype}" in names and "positions.3.float64" not in names
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
    assert not list(written.parent.glob(".*tmp*")), "no temporary file left beside it"
    session = load_session(store.folder)
    (layer,) = session.document.layers
    _assert_same(layer.data, original)
    np.testing.assert_array_equal(layer.selection, doc.layers[0].selection)
    store.close()


def test_a_saved_session_file_keeps_a_mapped_trx_as_stored(tmp_path):
    original = load_tractogram(_trx(tmp_path, "float16"))
    path = save_session(_document(original), tmp_path / "work.tractlens")
    _assert_same(load_session(path).document.layers[0].data, original)


def test_a_tractogram_in_memory_or_on_another_affine_is_still_written_as_float64(tmp_path):
    computed = _tractogram(n=50)
    assert not tractogram_exact.written_as_stored(computed)
    mapped = load_tractogram(save_tractogram(computed, tmp_path / "t.trx"))
    assert tractogram_exact.written_as_stored(mapped)
    moved = Tractogram(mapped.mapped, mapped.offsets, AFFINE @ np.diag([2.0, 2.0, 2.0, 1.0]), mapped.dimensions)
    assert not tractogram_exact.written_as_stored(moved)  # its voxels were not made through this affine
    for tract in (computed, moved):
        path = tractogram_exact.save_tractogram_exact(tract, tmp_path / "exact.trx")
        back = load_tractogram(path, grid=(tract.affine, tract.dimensions))
        assert back.mapped is None  # float64 millimetres: converted on reading
        np.testing.assert_array_equal(back.points, tract.points)


@pytest.mark.parametrize("as_stored", [True, False])
def test_the_autosave_of_a_mapped_trx_holds_a_chunk_not_a_copy(tmp_path, monkeypatch, as_stored):
    """Allocations traced while the autosave's folder writer writes a 1 M-point mapped .trx
    (12 MB of float32 positions, 4 MB of FA): a chunk of 16 k points at a time. The control (the
    float64 path this replaces) allocates a float64 copy of the positions and more."""
    monkeypatch.setattr(tractogram_exact, "CHUNK_POINTS", 1 << 14)
    if not as_stored:
        monkeypatch.setattr(tractogram_exact, "written_as_stored", lambda tract: False)
    source = _trx(tmp_path, "float32", n=25_000, points=40)
    original = load_tractogram(source)
    assert original.n_points == 1_000_000
    doc = _document(original)
    writer = SessionFolder(tmp_path / "autosave")
    writer.write(snapshot(Document()))  # imports and first-use caches out of the count
    snap = snapshot(doc)
    tracemalloc.start()
    try:
        assert writer.write(snap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if as_stored:
        # a chunk of positions (192 kB) or of FA, the offsets' chunk, zipfile's buffers
        assert peak < 2e6, peak
        if Path("/proc/self/smaps").exists():
            assert file_rss(source) == 0  # read with pread: no page of the source file stays mapped
    else:
        assert peak > 24e6, peak  # the float64 copy of the positions
    assert not original.mapped.made  # writing it made no voxel coordinates either
