"""COMMIT's inputs on the DWI's grid: which voxels have usable signal, the signal of those the
streamlines pass through (normalised by b=0, read in slabs), EC compartments from a peaks file,
and whether the segments go on the device."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tractlens.gpu import commit, commit_operator, commit_segments
from tractlens.gpu.host import release_freed_memory

from ..errors import InputError
from ..grid import Grid
from ..io._pages import release_pages
from ..io.dwi import fsl_to_voxel_vectors
from ..io.nifti import load_image
from ..timing import phase


def _segments_fit_on_device(backend, tractogram) -> bool:
    """Whether the segments can be built and kept on the device (GPU backends): room for about
    1.5 segments per point while they are built, with a third of the device left for the fit."""
    if not backend.is_gpu:
        return False
    need = 1.5 * len(tractogram.points) * commit_segments.DEVICE_BUILD_BYTES_PER_SEGMENT
    return need < 0.66 * backend.free_memory_bytes()


def _finite_voxels(data: np.ndarray) -> np.ndarray:
    """Voxels whose every measurement is finite, slab by slab (no 4-D boolean temporary)."""
    out = np.empty(data.shape[:3], dtype=bool)
    for i in range(data.shape[0]):
        out[i] = np.isfinite(data[i]).all(axis=-1)
    return out


#: Slabs (of the last spatial axis) read between releases of a mapped series' pages
RELEASE_EVERY_SLABS = 16
#: Voxels of a slab divided at a time (1.2 MB of float32 signal at 288 measurements)
SIGNAL_BLOCK_VOXELS = 1024


def _normalised_signal(data: np.ndarray, b0: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """``data[usable] / b0[usable]`` (n, M) in the rows' (C) order, in the data's precision: the
    values the float64 fit takes exactly, at half the memory of a float64 copy. Read a slab of
    the last spatial axis at a time (contiguous in the file's column-major order) by a pool of
    threads, :data:`SIGNAL_BLOCK_VOXELS` voxels at a time; a read-only mapped series gives its
    pages back every few slabs. The blocks bound the threads' temporaries: freed in each
    thread's own heap (glibc's arenas, which ``malloc_trim`` does not shrink), whole slabs'
    (tens of MB a thread at 1 mm) stayed resident through the fit."""
    out = np.empty((int(usable.sum()), data.shape[-1]), dtype=np.result_type(data.dtype, b0.dtype))
    row_of = np.full(usable.shape, -1, dtype=np.int64)
    row_of[usable] = np.arange(len(out))

    def slab(k: int) -> None:
        xs, ys = np.nonzero(usable[:, :, k])  # in C order, as a boolean index gives them
        for a in range(0, len(xs), SIGNAL_BLOCK_VOXELS):
            x, y = xs[a : a + SIGNAL_BLOCK_VOXELS], ys[a : a + SIGNAL_BLOCK_VOXELS]
            out[row_of[x, y, k]] = data[x, y, k] / b0[x, y, k][:, None]
        if k % RELEASE_EVERY_SLABS == RELEASE_EVERY_SLABS - 1:
            release_pages(data)

    workers = min(8, os.cpu_count() or 1, max(1, data.shape[2]))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(slab, range(data.shape[2])))
    release_pages(data)
    release_freed_memory()
    return out


PEAKS_FRAMES = ("world", "fsl")


def peaks_compartments(
    path, rows: np.ndarray, affine: np.ndarray, notes: list[str], frame: str = "world"
) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments (row, orientation) from a peaks file on the DWI grid (``frame``: one of
    :data:`PEAKS_FRAMES`)."""

    if frame not in PEAKS_FRAMES:
        raise InputError(f"unknown peaks frame {frame!r}: one of {', '.join(PEAKS_FRAMES)}")

    with phase("read"):
        img = load_image(path, "peaks file")
        data = np.asarray(img.dataobj, dtype=np.float64)
    if data.ndim != 4 or data.shape[3] % 3 or data.shape[:3] != rows.shape:
        raise InputError(
            f"a peaks file must be (X, Y, Z, 3K) on the DWI's grid {rows.shape}, got {data.shape}",
            path=path,
            fix="Compute the peaks on the DWI's grid (e.g. MRtrix sh2peaks)",
        )
    if not Grid.affines_match(img.affine, affine):
        notes.append(f"{path}: its affine differs from the DWI's; the voxels are taken as the same")
    peaks = np.nan_to_num(data).reshape(*rows.shape, -1, 3)
    inside = rows >= 0
    vectors = peaks[inside]  # (n, K, 3)
    row_of = np.repeat(rows[inside], vectors.shape[1])
    flat = vectors.reshape(-1, 3)
    present = np.linalg.norm(flat, axis=1) > 0
    if frame == "fsl":
        axes = fsl_to_voxel_vectors(flat[present], affine)
    else:
        rotation = affine[:3, :3] / np.sqrt((affine[:3, :3] ** 2).sum(0))  # world -> voxel axes: R^T
        axes = flat[present] @ rotation  # row vectors: (R^T d)^T = d^T R
    return commit_operator.ec_compartments(row_of[present], commit.orientation_index(axes))
