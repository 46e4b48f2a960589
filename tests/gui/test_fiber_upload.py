"""A memory-mapped tractogram goes to the GPU without staying in the window's resident memory
(issue 41: the window's host memory stays within 1.5 x a 10 M-streamline .trx): each chunk
:func:`widgets.gl_fibers.upload` reads from the map is released after it is uploaded; and the
fibre layer's anchor is bounded by the grid's box in the points' frame. A stub OpenGL that
copies what it is given stands in for the driver (no window, no context)."""

from pathlib import Path

import numpy as np
import pytest
from vtkmodules.util.numpy_support import vtk_to_numpy

from tests._mapped_files import file_rss
from tractlens.app.fiber_arrays import FiberArrays
from tractlens.app.io import _pages  # file_region: is the test array file-backed
from tractlens.widgets import gl_fibers
from tractlens.widgets.gl_fiber_actors import GLFiberActors, box_corners

CHUNK = 1 << 20


class CopyingGL:
    """The few calls :func:`gl_fibers.upload` makes; ``glBufferSubData`` copies the bytes (so a
    memory map's pages are read, as a driver reads them) and calls ``after_each`` then."""

    GL_ARRAY_BUFFER, GL_STATIC_DRAW = 0x8892, 0x88E4

    def __init__(self, after_each=None):
        self.store = bytearray()
        self.chunks: list[tuple[int, int, int]] = []  # (buffer offset, bytes, host address)
        self.after_each = after_each

    def glBindBuffer(self, target, buffer):
        pass

    def glBufferData(self, target, size, data, usage):
        self.store = bytearray(size)

    def glBufferSubData(self, target, offset, size, data):
        self.store[offset : offset + size] = np.ascontiguousarray(data).tobytes()[:size]
        self.chunks.append((offset, size, data.ctypes.data))
        if self.after_each is not None:
            self.after_each()


def mapped_points(tmp_path: Path, n_points: int, mode: str = "r") -> tuple[Path, np.ndarray, np.ndarray]:
    """A file of float32 (n, 3) points, its values, and a memory map of it as a reader hands it
    out (a plain ndarray view of the ``numpy.memmap``)."""
    values = np.random.default_rng(0).random((n_points, 3), dtype=np.float32)
    path = tmp_path / "points.f32"
    values.tofile(path)
    mapped = np.asarray(np.memmap(path, dtype=np.float32, mode=mode, shape=(n_points, 3)))
    assert _pages.file_region(mapped) is not None  # file-backed
    return path, values, mapped


def test_each_uploaded_chunk_of_a_mapped_piece_is_released(tmp_path, monkeypatch):
    monkeypatch.setattr(gl_fibers, "UPLOAD_CHUNK_BYTES", CHUNK)
    _path, values, mapped = mapped_points(tmp_path, 300_000, mode="r+")  # 3.6 MB: 4 chunks
    released = []

    def spy(array):
        done = _pages.release_pages(array)
        released.append((array.ctypes.data, array.nbytes, done))
        return done

    monkeypatch.setattr(gl_fibers, "release_pages", spy)
    piece = mapped[1000:250_000]  # a piece of the tractogram: a view of the map
    GL = CopyingGL()
    gl_fibers.upload(GL, 1, piece)
    assert np.array_equal(np.frombuffer(bytes(GL.store), np.float32).reshape(-1, 3), values[1000:250_000])
    assert len(GL.chunks) == -(-piece.nbytes // (CHUNK // 12 * 12)) == 3
    # one release after each chunk, of that chunk, and the map's pages did go
    assert [(address, size) for address, size, _done in released] == [(a, n) for _o, n, a in GL.chunks]
    assert all(done for *_chunk, done in released)


def test_an_ordinary_array_is_uploaded_alike_and_nothing_is_released(monkeypatch):
    monkeypatch.setattr(gl_fibers, "UPLOAD_CHUNK_BYTES", CHUNK)
    released = []
    monkeypatch.setattr(gl_fibers, "release_pages", lambda array: released.append(_pages.release_pages(array)))
    values = np.random.default_rng(1).random((200_000, 3), dtype=np.float32)
    GL = CopyingGL()
    gl_fibers.upload(GL, 1, values)
    assert np.array_equal(np.frombuffer(bytes(GL.store), np.float32).reshape(-1, 3), values)
    assert released == [False] * len(GL.chunks) and len(GL.chunks) == 3


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
@pytest.mark.parametrize("release", [True, False])
def test_the_uploaded_pages_of_the_map_do_not_stay_resident(tmp_path, monkeypatch, release):
    """Deterministic: what is measured is the pages of this one file mapped into the process
    (no timing, no other allocation counts). Without the release (the control) the whole file
    stays resident after the upload; with it, at most one chunk is resident at any time."""
    monkeypatch.setattr(gl_fibers, "UPLOAD_CHUNK_BYTES", CHUNK)
    if not release:
        monkeypatch.setattr(gl_fibers, "release_pages", lambda array: False)
    path, values, mapped = mapped_points(tmp_path, 2_000_000)  # 24 MB, 23 chunks
    size = values.nbytes
    _pages.release_pages(mapped)
    assert file_rss(path) == 0
    during = []
    GL = CopyingGL(after_each=lambda: during.append(file_rss(path)))
    gl_fibers.upload(GL, 1, mapped)
    after = file_rss(path)
    assert np.array_equal(np.frombuffer(bytes(GL.store), np.float32).reshape(-1, 3), values)
    assert len(during) == 23 and during[0] > 0  # the copy did read the map's pages
    if release:
        assert after == 0
        # one chunk at a time (and up to a 2 MB folio the kernel maps whole on each side of it)
        assert max(during) <= CHUNK + (4 << 20) < size / 4
    else:
        assert after >= 0.9 * size  # the control: the file's pages kept, as before the release


def arrays_of(points, affine, box=None) -> FiberArrays:
    offsets = np.arange(0, len(points) + 1, 10, dtype=np.int64)
    arrays = FiberArrays(points, affine, offsets, ranges_only=True)
    arrays.box = box
    return arrays


def anchor_corners(scene: GLFiberActors) -> np.ndarray:
    return vtk_to_numpy(scene._box.GetPoints().GetData())


def test_the_anchor_is_bounded_by_the_box_in_the_points_frame():
    """A mapped file's millimetres (identity affine) are bounded by ``arrays.box`` (the grid's
    corners in millimetres), not by the grid's voxel corners; without a box, by the voxel ones."""
    points = np.random.default_rng(2).uniform(-60, 60, (100, 3)).astype(np.float32)
    box = np.array([[x, y, z] for x in (-70, 75) for y in (-90, 60) for z in (-50, 80)], np.float32)
    scene = GLFiberActors(arrays_of(points, np.eye(4), box), (10, 12, 14))
    np.testing.assert_array_equal(anchor_corners(scene), box)
    np.testing.assert_allclose(scene.anchor.GetBounds(), [-70, 75, -90, 60, -50, 80])
    # a tractogram growing (a tracking result): the new arrays' box
    scene.set_arrays(arrays_of(points, np.eye(4), box * 2))
    np.testing.assert_array_equal(anchor_corners(scene), box * 2)
    # voxel coordinates and no box: the grid's voxel corners
    voxels = GLFiberActors(arrays_of(points, np.diag([2.0, 2.0, 2.0, 1.0])), (10, 12, 14))
    np.testing.assert_array_equal(anchor_corners(voxels), box_corners((10, 12, 14)))


def test_a_float16_map_is_uploaded_as_float32_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A file's float16 positions stay float16 in the view's arrays (the pieces are views of the
    map) and go to the GPU as float32, converted and released one chunk at a time: the values of
    converting the whole, with at most a chunk's float32 allocated (not the whole float32 copy)."""
    import tracemalloc

    monkeypatch.setattr(gl_fibers, "UPLOAD_CHUNK_BYTES", CHUNK)
    values = np.random.default_rng(3).uniform(-80, 80, (2_000_000, 3)).astype(np.float16)  # 24 MB as float32
    path = tmp_path / "points.f16"
    values.tofile(path)
    mapped = np.asarray(np.memmap(path, dtype=np.float16, mode="r", shape=values.shape))
    scene = GLFiberActors(arrays_of(mapped, np.eye(4)), (10, 12, 14))
    [piece] = scene.pieces
    assert piece.dtype == np.float16 and np.shares_memory(piece, mapped)  # no copy made for the view
    released = []
    monkeypatch.setattr(gl_fibers, "release_pages", lambda array: released.append(_pages.release_pages(array)))
    GL = CopyingGL()
    GL.store = bytearray(12 * len(values))  # (allocated before the count: the stub's own copy)
    GL.glBufferData = lambda target, size, data, usage: None
    tracemalloc.start()
    try:
        gl_fibers.upload(GL, 1, piece)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(np.frombuffer(bytes(GL.store), np.float32).reshape(-1, 3), values.astype(np.float32))
    chunks = -(-12 * len(values) // (CHUNK // 12 * 12))
    assert len(GL.chunks) == chunks == 23 and all(released) and len(released) == chunks
    assert [offset for offset, _n, _a in GL.chunks] == [k * (CHUNK // 12) * 12 for k in range(chunks)]
    # a chunk as float32, and the stub's copy of it as bytes: not the 24 MB of the whole
    assert peak < 4 * CHUNK < 12 * len(values) / 5, peak
