"""FSL bedpostX output folders (read), for probabilistic tracking.

A folder holds, per fibre population i = 1, 2, ...: ``merged_th{i}samples``,
``merged_ph{i}samples`` and ``merged_f{i}samples`` (4-D, last axis the posterior
samples) and ``nodif_brain_mask``. Directions (sinθcosφ, sinθsinφ, cosθ) are in
FSL's voxel frame, like bvecs. As probtrackx's ``--samples``, a folder may also be given by
its files' base name, ``DIR/merged`` (:func:`split_samples_path`).
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import get_backend
from tractlens.gpu.ballstick import dyadic_mean

from ..errors import InputError
from ..grid import Grid
from ..model import DyadsVolume
from . import bedpostx_cache
from .dwi import fsl_to_voxel_vectors, save_gradients
from .nifti import _read, load_image, read_array, read_raw, save_volume, save_volume_slabs

RERUN = (
    "Give a complete bedpostX output folder (merged_th/ph/f{i}samples and nodif_brain_mask on one grid); "
    "if files are damaged, run bedpostx or tractlens fit-ballstick again"
)

#: Voxels whose mean dyads are computed at a time (bounds the float64 temporaries).
DYAD_BLOCK_VOXELS = 32768
#: Fractions below this are not drawn as dyads (FSL's ``dyads{i}_thr0.05`` convention).
DYAD_F_THRESHOLD = 0.05


@dataclass
class BedpostSamples:
    """Posterior samples: theta, phi, f are (X, Y, Z, n_fibres, n_samples) float32."""

    theta: np.ndarray
    phi: np.ndarray
    f: np.ndarray
    mask: np.ndarray
    affine: np.ndarray
    path: str = ""
    #: the cache entry these samples were mapped from or written to (None: not cached), where
    #: what tracking derives from them is kept too (:func:`~app.io.bedpostx_cache.save_derived`)
    cache_entry: Path | None = None
    #: the entry a first read is writing behind it (:class:`~app.io.bedpostx_cache.PendingEntry`):
    #: ``cache_entry`` is set once it is published; meanwhile θ, φ and f are read-only
    pending_cache: object | None = None

    @property
    def n_fibres(self) -> int:
        return int(self.theta.shape[3])

    @property
    def n_samples(self) -> int:
        return int(self.theta.shape[4])

    def dyads(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean directions (X, Y, Z, n_fibres, 3), FSL frame, and dispersions (X, Y, Z, n_fibres),
        zero outside the mask (see :func:`gpu.ballstick.dyadic_mean`)."""
        dyads = np.zeros((*self.mask.shape, self.n_fibres, 3), dtype=np.float32)
        dispersion = np.zeros((*self.mask.shape, self.n_fibres), dtype=np.float32)
        inside = np.flatnonzero(self.mask)
        # Voxel by voxel, so in blocks: the float64 sample vectors of a whole brain are gigabytes.
        for start in range(0, inside.size, DYAD_BLOCK_VOXELS):
            block = np.unravel_index(inside[start : start + DYAD_BLOCK_VOXELS], self.mask.shape)
            dyads[block], dispersion[block] = dyadic_mean(self.theta[block], self.phi[block])
        return dyads, dispersion


def _find(folder: Path, stem: str) -> Path | None:
    for suffix in (".nii.gz", ".nii"):
        candidate = folder / f"{stem}{suffix}"
        if candidate.exists():
            return candidate
    return None


#: The base name of the sample files bedpostx writes (probtrackx's ``--samples DIR/merged``).
SAMPLES_BASE = "merged"


def split_samples_path(path: str | os.PathLike) -> tuple[Path, str]:
    """The folder and the sample files' base name of a bedpostX folder given either as the folder
    or, as probtrackx takes it, as ``DIR/BASE`` with ``DIR/BASE_th1samples.nii.gz`` beside
    (``DIR/merged`` for bedpostx's output). Anything else comes back as a folder, for the loader
    to refuse with its own message."""
    path = Path(path)
    if not path.is_dir() and path.name and path.parent.is_dir():
        if _find(path.parent, f"{path.name}_th1samples") is not None:
            return path.parent, path.name
    return path, SAMPLES_BASE


def is_samples_base(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a bedpostX folder's ``DIR/merged`` base name (not a folder itself)."""
    return split_samples_path(path)[0] != Path(path)


def _source_files(folder: Path, base: str = SAMPLES_BASE) -> tuple[Path, list[tuple[Path, Path, Path]]]:
    """The mask and, per fibre, the θ, φ and f sample files; :class:`InputError` when one is missing."""
    if not folder.is_dir():
        raise InputError(
            "not a folder",
            path=folder,
            fix="Give the bedpostX output folder (e.g. subject.bedpostX) or its base name (subject.bedpostX/merged)",
        )
    mask_path = _find(folder, "nodif_brain_mask")
    if mask_path is None:
        raise InputError("no nodif_brain_mask in this folder: not a bedpostX output", path=folder, fix=RERUN)
    fibres = []
    while _find(folder, f"{base}_th{len(fibres) + 1}samples") is not None:
        paths = []
        for name in ("th", "ph", "f"):
            path = _find(folder, f"{base}_{name}{len(fibres) + 1}samples")
            if path is None:
                raise InputError(f"{base}_{name}{len(fibres) + 1}samples is missing", path=folder, fix=RERUN)
            paths.append(path)
        fibres.append(tuple(paths))
    if not fibres:
        raise InputError(f"no {base}_th1samples in this folder: not a bedpostX output", path=folder, fix=RERUN)
    return mask_path, fibres


def source_files(folder: str | os.PathLike) -> list[Path]:
    """The files a read of ``folder`` (or ``DIR/merged``) depends on, in the order the cache fingerprints them."""
    folder, base = split_samples_path(folder)
    mask_path, fibres = _source_files(folder, base)
    return [mask_path, *(path for paths in fibres for path in paths)]


def _cache_key(folder: Path, base: str) -> Path:
    """The path a cache entry is named after: the folder, or ``DIR/BASE`` for another base name."""
    return folder if base == SAMPLES_BASE else folder / base


def load_bedpostx(folder: str | os.PathLike, *, cache: bool = True) -> BedpostSamples:
    """Read a bedpostX output folder; raise :class:`InputError` naming what is missing or inconsistent.

    With ``cache`` (and :func:`~app.io.bedpostx_cache.cache_enabled`) the first read keeps the
    arrays in the user's cache folder and later reads map them (:mod:`app.io.bedpostx_cache`),
    as long as no file of the folder changed."""

    folder, base = split_samples_path(folder)
    mask_path, fibres = _source_files(folder, base)
    sources = [mask_path, *(path for paths in fibres for path in paths)]
    key = _cache_key(folder, base)
    use_cache = cache and bedpostx_cache.cache_enabled()
    if use_cache:
        bedpostx_cache.wait_for_entry(key)  # this process is writing it behind an earlier read
        cached = bedpostx_cache.load_entry(key, sources)
        if cached is not None:
            return BedpostSamples(
                theta=cached["theta"],
                phi=cached["phi"],
                f=cached["f"],
                mask=cached["mask"],
                affine=cached["affine"],
                path=str(folder),
                cache_entry=bedpostx_cache.entry_dir(key),
            )
        prints = bedpostx_cache.fingerprint(sources)
    samples = _read_folder(folder, mask_path, fibres)
    if use_cache and bedpostx_cache.settled(sources):
        # the entry is written behind: this read returns as soon as the arrays are in memory
        writer = bedpostx_cache.EntryWriter(key, sources, prints)
        arrays = {"theta": samples.theta, "phi": samples.phi, "f": samples.f, "mask": samples.mask}
        samples.pending_cache = writer.write_behind(arrays, samples.affine)
        samples.pending_cache.when_ready(lambda entry: setattr(samples, "cache_entry", entry))
    return samples


#: Decompressed bytes of sample files held at once while a folder is read (bounds the readers).
READ_MEMORY_BYTES = 8 << 30
#: Most files read at once (each inflates on its own core; the copies share the memory bus).
MAX_READ_THREADS = 16  # an HCP folder has 9 files: all at once (a second round doubles the time)


def _read_threads(n_files: int, file_bytes: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1

    available = get_backend("cpu").free_memory_bytes()  # the host's available memory
    budget = min(READ_MEMORY_BYTES, available // 3)  # beside the arrays being filled
    by_memory = max(1, budget // max(1, file_bytes))
    return max(1, min(MAX_READ_THREADS, cores, n_files, by_memory))


def _check_images(folder: Path, mask_img, mask: np.ndarray, fibres) -> list[tuple[object, Path]]:
    """Every sample file's header checked against the mask (grid, affine, shape); in file order."""
    images = []
    for fibre, paths in enumerate(fibres, start=1):
        shapes = []
        for path in paths:
            img = load_image(path, "bedpostX samples")
            shape = tuple(img.shape)
            if len(shape) not in (3, 4):
                raise InputError(
                    f"samples must be a 4-D image (X, Y, Z, samples), this one has shape {shape}", path=path, fix=RERUN
                )
            if shape[:3] != mask.shape:
                raise InputError(f"samples have grid {shape[:3]} but the mask has {mask.shape}", path=path, fix=RERUN)
            if not Grid.affines_match(img.affine, mask_img.affine):
                raise InputError(
                    "samples and nodif_brain_mask are on different grids (affines differ)", path=path, fix=RERUN
                )
            shapes.append(shape if len(shape) == 4 else (*shape, 1))
            images.append((img, path))
        if len(set(shapes)) != 1:
            raise InputError(f"theta, phi and f samples of fibre {fibre} differ in shape", path=folder, fix=RERUN)
    if len({tuple(img.shape[3:4]) or (1,) for img, _ in images}) != 1:
        raise InputError("fibre populations have different numbers of samples", path=folder, fix=RERUN)
    return images


def _read_folder(folder: Path, mask_path: Path, fibres: list[tuple[Path, Path, Path]]) -> BedpostSamples:
    """Check every header, then read each file once into one (X, Y, Z, n_fibres, n_samples) array
    per parameter (no per-file copies kept and stacked).

    Files are inflated and converted on several threads at once (ISA-L and NumPy's copies
    release the GIL), θ files first, then φ, then f, each a few volumes at a time
    (:func:`_read_samples_into`), into arrays backed by huge pages where Linux offers them.
    """
    mask_img = load_image(mask_path, "bedpostX mask")
    if len(mask_img.shape) != 3:
        raise InputError(f"nodif_brain_mask must be 3-D, it has shape {mask_img.shape}", path=mask_path, fix=RERUN)
    raw = read_raw(mask_img, mask_path, "bedpostX mask")
    mask = (raw != 0) & np.isfinite(raw)
    images = _check_images(folder, mask_img, mask, fibres)
    n_samples = int(images[0][0].shape[3]) if len(images[0][0].shape) == 4 else 1
    shape = (*mask.shape, len(fibres), n_samples)
    arrays = [_advise_huge_pages(np.empty(shape, dtype=np.float32)) for _ in range(3)]

    def read_one(index: int) -> None:
        img, path = images[index]
        _read_samples_into(img, path, arrays[index % 3][..., index // 3, :])

    order = sorted(range(len(images)), key=lambda index: (index % 3, index // 3))  # θ of every fibre, then φ, f
    threads = _read_threads(len(images), READ_CHUNK_BYTES)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(read_one, index) for index in order]:
            future.result()  # the first error (a damaged file) is raised here
    return BedpostSamples(*arrays, mask=mask, affine=mask_img.affine.copy(), path=str(folder))


#: ``madvise`` advice for transparent huge pages (Linux).
_MADV_HUGEPAGE = 14


def _advise_huge_pages(array: np.ndarray) -> np.ndarray:
    """Ask Linux to back a large fresh array with transparent huge pages (where THP is in
    ``madvise`` mode, the usual default): the readers then fault it in 2 MB at a time instead of
    4 kB (measured here: 0.1 s instead of 2.3 s to first-touch 900 MB on a VM). A hint only; the
    values are the same, and elsewhere (or on failure) nothing happens."""
    if array.nbytes < (64 << 20) or not sys.platform.startswith("linux"):
        return array
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        start = -(-array.ctypes.data // page) * page
        end = (array.ctypes.data + array.nbytes) // page * page
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(_MADV_HUGEPAGE))
    except (OSError, AttributeError, ValueError):
        pass
    return array


#: Decompressed bytes of one sample file a reader holds at a time (whole volumes, at least one).
READ_CHUNK_BYTES = 128 << 20


def _plain_float32(img) -> int | None:
    """The data offset of an image whose stored values are the values (native float32, no scaling,
    column-major), so its bytes can be inflated straight into place; None for any other."""
    proxy = img.dataobj
    try:
        dtype, order, offset = np.dtype(proxy.dtype), proxy.order, int(proxy.offset)
        slope, inter = float(proxy.slope), float(proxy.inter)
    except (AttributeError, TypeError, ValueError):
        return None
    if dtype != np.dtype(np.float32) or order != "F" or (slope, inter) != (1.0, 0.0):
        return None
    return offset


def _read_samples_into(img, path: Path, target: np.ndarray) -> None:
    """``target[...] = `` the file's samples (X, Y, Z, n_samples), NaN and ±Inf as 0.

    A plain float32 file is inflated a few whole volumes at a time into one reused buffer and
    scattered from there into the voxel-major target (:func:`_fill_finite`): no file-sized
    temporary, so the pages faulted in are the target's only. Other files (scaled, other types)
    go through :func:`~app.io.nifti.read_array`, as nibabel reads them. Any failure is an
    :class:`InputError` naming the file."""
    offset = _plain_float32(img)
    if offset is None:
        data = read_array(img, path, what="bedpostX samples")
        _fill_finite(target, data.reshape(target.shape, order="F"))
        return
    _read(img, path, "bedpostX samples", lambda: _inflate_into(path, offset, target))


def _inflate_into(path: Path, offset: int, target: np.ndarray) -> None:
    from nibabel.openers import ImageOpener

    shape = target.shape
    volume = math.prod(shape[:3])
    step = max(1, min(shape[3], READ_CHUNK_BYTES // max(1, 4 * volume)))
    flat = np.empty(volume * step, dtype=np.float32)
    buffer = flat.reshape((*shape[:3], step), order="F")  # column-major: k volumes are flat[: volume * k]
    with ImageOpener(str(path), "rb") as fh:
        fh.seek(offset)
        for start in range(0, shape[3], step):
            k = min(step, shape[3] - start)
            view = memoryview(flat[: volume * k]).cast("B")
            got = fh.readinto(view)
            if got != view.nbytes:
                raise EOFError(f"the file ends after {start * volume * 4 + got} bytes of samples")
            _fill_finite(target[..., start : start + k], buffer[..., :k])


def _fill_finite(target: np.ndarray, data: np.ndarray) -> None:
    """``target[...] = data`` with NaN and ±Inf as 0, a slice at a time: the file's column-major
    volume goes into the samples' voxel-major array, and whole-volume strided copies thrash the cache.
    Each slice is first gathered sample-minor into a small buffer (read in order, cleaned there),
    then copied over in one pass (written in order)."""
    buffer = np.empty(data.shape[:2] + data.shape[3:], dtype=target.dtype)
    for z in range(data.shape[2]):
        np.copyto(buffer, data[:, :, z], casting="unsafe")
        np.copyto(buffer, 0.0, where=~np.isfinite(buffer))
        target[:, :, z] = buffer


def dyad_volume(samples: BedpostSamples, name: str = "dyads") -> DyadsVolume:
    """The fibre orientations as a display volume of kind ``dyads``.

    Data (X, Y, Z, n_fibres, 4): per stick a unit direction in voxel axes
    (converted from FSL's frame) and its mean fraction; zero where the mean
    fraction is below :data:`DYAD_F_THRESHOLD` or outside the mask.
    """
    dyads, _ = samples.dyads()
    data = np.zeros((*samples.mask.shape, samples.n_fibres, 4), dtype=np.float32)
    data[..., :3] = fsl_to_voxel_vectors(dyads, samples.affine)
    data[..., 3] = samples.f.mean(axis=-1)
    data[data[..., 3] < DYAD_F_THRESHOLD] = 0.0
    return DyadsVolume(name, data, samples, source=samples.path)


#: Files of a bedpostX folder written by :func:`save_bedpostx` ({i}: stick 1..n).
BEDPOSTX_OUTPUTS = {
    "merged_th{i}samples.nii.gz": "θ samples of stick i (4-D, last axis the samples), radians",
    "merged_ph{i}samples.nii.gz": "φ samples of stick i, radians",
    "merged_f{i}samples.nii.gz": "volume-fraction samples of stick i",
    "mean_th{i}samples.nii.gz": "mean of the θ samples (as FSL: arithmetic mean)",
    "mean_ph{i}samples.nii.gz": "mean of the φ samples",
    "mean_f{i}samples.nii.gz": "mean fraction of stick i",
    "dyads{i}.nii.gz": "mean direction of stick i (principal eigenvector of the mean dyadic tensor), FSL frame",
    "dyads{i}_dispersion.nii.gz": "1 − largest eigenvalue of the mean dyadic tensor (0 = no spread)",
    "mean_dsamples.nii.gz": "mean diffusivity d, mm²/s",
    "mean_S0samples.nii.gz": "mean S0",
    "mean_fsumsamples.nii.gz": "sum of the mean fractions",
    "nodif_brain_mask.nii.gz": "voxels fitted",
    "bvals": "b-values (FSL format)",
    "bvecs": "b-vectors (FSL format)",
}


#: Files written besides :data:`BEDPOSTX_OUTPUTS` by a model-2 fit (FSL's names).
BEDPOSTX_MODEL2_OUTPUTS = {
    "mean_d_stdsamples.nii.gz": "mean standard deviation of the gamma-distributed diffusivities, mm²/s (model 2)",
}


def _bedpostx_folder(folder: str | os.PathLike) -> Path:
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise InputError(
            "the output path exists and is not a folder", path=out, fix="Give a folder name, or move the file away"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_bedpostx(
    folder: str | os.PathLike,
    samples: BedpostSamples,
    *,
    s0: np.ndarray | None = None,
    d: np.ndarray | None = None,
    bvals: np.ndarray | None = None,
    bvecs: np.ndarray | None = None,
) -> dict[str, str]:
    """Write a bedpostX folder that FSL's probtrackx and :func:`load_bedpostx` read.

    ``samples`` angles are in FSL's frame. ``s0``/``d`` are (X, Y, Z, n_samples)
    samples (their means are written); ``bvals``/``bvecs`` (voxel axes, as
    :class:`~app.io.DWI` holds them) are written in FSL format when given. Every
    file is written atomically; gzip runs on several threads.
    """
    out = _bedpostx_folder(folder)
    aff = samples.affine
    dyads, dispersion = samples.dyads()
    jobs: list[tuple[np.ndarray, str, type]] = []
    fmeans = samples.f.mean(axis=-1)
    for i in range(samples.n_fibres):
        n = i + 1
        for key, values in (("th", samples.theta), ("ph", samples.phi), ("f", samples.f)):
            jobs.append((values[..., i, :], f"merged_{key}{n}samples.nii.gz", np.float32))
            jobs.append((values[..., i, :].mean(axis=-1), f"mean_{key}{n}samples.nii.gz", np.float32))
        jobs.append((dyads[..., i, :], f"dyads{n}.nii.gz", np.float32))
        jobs.append((dispersion[..., i], f"dyads{n}_dispersion.nii.gz", np.float32))
    jobs.append((fmeans.sum(axis=-1), "mean_fsumsamples.nii.gz", np.float32))
    if s0 is not None:
        jobs.append((s0.mean(axis=-1), "mean_S0samples.nii.gz", np.float32))
    if d is not None:
        jobs.append((d.mean(axis=-1), "mean_dsamples.nii.gz", np.float32))
    jobs.append((samples.mask, "nodif_brain_mask.nii.gz", np.uint8))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        futures = [pool.submit(save_volume, data, aff, out / name, dtype=dtype) for data, name, dtype in jobs]
        for future in futures:
            future.result()
    written = [name for _, name, _ in jobs]
    if bvals is not None and bvecs is not None:
        save_gradients(bvals, bvecs, aff, out / "bvals", out / "bvecs")
        written += ["bvals", "bvecs"]
    return {name: str(out / name) for name in written}


#: Bytes of one slab of samples (a few volumes) scattered and compressed at a time per file.
WRITE_SLAB_BYTES = 64 << 20


def _on_grid(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.shape + values.shape[1:], dtype=np.float32)
    out[mask] = values
    return out


def _sample_slabs(mask: np.ndarray, flat_index: np.ndarray, values: np.ndarray):
    """The (X, Y, Z, k) slabs of a merged samples file from the masked (N, S) ``values``: a few
    samples at a time scattered into zeroed volumes, in the file's column-major order."""
    n_samples = values.shape[1]
    step = max(1, WRITE_SLAB_BYTES // (4 * mask.size))
    for start in range(0, n_samples, step):
        part = np.ascontiguousarray(values[:, start : start + step].T)  # (k, N): read once, in order
        out = np.zeros((part.shape[0], mask.size), dtype=np.float32)
        out[:, flat_index] = part
        yield out.reshape(part.shape[0], *mask.shape[::-1]).T  # a column-major (X, Y, Z, k) view


def save_bedpostx_masked(
    folder: str | os.PathLike,
    mask: np.ndarray,
    affine: np.ndarray,
    theta: np.ndarray,
    phi: np.ndarray,
    f: np.ndarray,
    *,
    s0: np.ndarray | None = None,
    d: np.ndarray | None = None,
    d_std: np.ndarray | None = None,
    bvals: np.ndarray | None = None,
    bvecs: np.ndarray | None = None,
) -> dict[str, str]:
    """:func:`save_bedpostx` from the samples of the voxels in ``mask`` only: θ, φ, f as
    (N, n_fibres, n_samples) and ``s0``/``d``/``d_std`` as (N, n_samples), in ``mask``'s (C)
    voxel order (``d_std``, model 2's, gives ``mean_d_stdsamples``).

    The same files, value for value, without the (X, Y, Z, n_fibres, n_samples) arrays: each
    merged file is scattered into its grid a few volumes at a time and compressed as it goes
    (:func:`~app.io.nifti.save_volume_slabs`), several files at once."""
    out = _bedpostx_folder(folder)
    mask = np.asarray(mask, dtype=bool)
    shape = (*mask.shape, theta.shape[2])
    flat_index = np.ravel_multi_index(np.nonzero(mask), mask.shape, order="F")
    merged = [
        (values[:, i, :], f"merged_{key}{i + 1}samples.nii.gz")
        for i in range(theta.shape[1])
        for key, values in (("th", theta), ("ph", phi), ("f", f))
    ]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        futures = [
            pool.submit(save_volume_slabs, shape, affine, out / name, _sample_slabs(mask, flat_index, values))
            for values, name in merged
        ]
        # the mean dyads (float64, per sample) are computed here while the pool compresses the samples
        dyads = np.empty((*theta.shape[:2], 3), dtype=np.float32)
        dispersion = np.empty(theta.shape[:2], dtype=np.float32)
        for start in range(0, theta.shape[0], DYAD_BLOCK_VOXELS):
            block = slice(start, start + DYAD_BLOCK_VOXELS)
            dyads[block], dispersion[block] = dyadic_mean(theta[block], phi[block])
        small: list[tuple[np.ndarray, str, type]] = []
        for i in range(theta.shape[1]):
            n = i + 1
            for key, values in (("th", theta), ("ph", phi), ("f", f)):
                small.append(
                    (_on_grid(mask, values[:, i, :].mean(axis=-1)), f"mean_{key}{n}samples.nii.gz", np.float32)
                )
            small.append((_on_grid(mask, dyads[:, i, :]), f"dyads{n}.nii.gz", np.float32))
            small.append((_on_grid(mask, dispersion[:, i]), f"dyads{n}_dispersion.nii.gz", np.float32))
        small.append((_on_grid(mask, f.mean(axis=-1).sum(axis=-1)), "mean_fsumsamples.nii.gz", np.float32))
        if s0 is not None:
            small.append((_on_grid(mask, s0.mean(axis=-1)), "mean_S0samples.nii.gz", np.float32))
        if d is not None:
            small.append((_on_grid(mask, d.mean(axis=-1)), "mean_dsamples.nii.gz", np.float32))
        if d_std is not None:
            small.append((_on_grid(mask, d_std.mean(axis=-1)), "mean_d_stdsamples.nii.gz", np.float32))
        small.append((mask, "nodif_brain_mask.nii.gz", np.uint8))
        futures += [pool.submit(save_volume, data, affine, out / name, dtype=dtype) for data, name, dtype in small]
        for future in futures:
            future.result()
    written = [name for _, name in merged] + [name for _, name, _ in small]
    if bvals is not None and bvecs is not None:
        save_gradients(bvals, bvecs, affine, out / "bvals", out / "bvecs")
        written += ["bvals", "bvecs"]
    return {name: str(out / name) for name in written}
