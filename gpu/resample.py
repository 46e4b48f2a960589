"""A volume resampled through a voxel map: an affine, plus a displacement field looked up trilinearly.

For every voxel ``r`` (its index ``(i, j, k)``) of an output grid of ``shape``::

    source voxel = linear · r + step · field(at_field · r)

(``field`` optional: ``linear`` alone is an affine resampling), and the data are read there with
trilinear (``order=1``) or nearest-neighbour (``order=0``) interpolation. The edges follow
:func:`scipy.ndimage.map_coordinates` with ``mode="constant"`` and ``prefilter=False``, which is
what this replaces: a coordinate outside ``[0, n - 1]`` on any axis reads ``cval`` (the field reads
0), nearest rounds half up. Coordinates are computed in float64 on either backend, so the NumPy
path gives SciPy's values (to rounding) and the CuPy path the NumPy path's.

Written once against ``xp`` (NumPy or CuPy) for the GPU, where a slab is a few million voxels. On
the CPU the output is cut into slabs run on threads, by one of two paths that give the same bits:
NumPy operations into buffers kept per thread (:mod:`gpu.resample_host`), or numba's compiled loop
(:mod:`gpu.resample_loops`, the ``cpu`` extra), chosen by :func:`_compiled_pays`. Arrays in, arrays
out: no files, no grids.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from .backend import Backend, Cancelled, get_backend
from .host import compile_or_uncached, host_threads, numba_module, run_parallel

#: Samples (output voxels × channels) per thread from which a fresh process starts numba's loop
#: rather than draw with NumPy (:mod:`gpu.resample_host`), per interpolation order. Starting numba
#: (import, the loop from its cache, numba's CPU target) costs ~0.7 s of one core on the 2-core
#: machine and 1.35 s on the GPU machine before the first voxel. CPU time per sample, one thread,
#: 2-core EPYC under load (1 mm outputs of 7.2 M voxels; 16 channels: a 2 mm grid, 0.55 M voxels):
#:
#: ========================================  ===========  ==========
#: case (ns per sample, one thread)           NumPy        numba loop
#: ========================================  ===========  ==========
#: labels through an affine + SyN field       72-80        37-41
#: labels through an affine                   12-13        8
#: image through an affine + SyN field        118-139      53-58
#: image through an affine (trilinear)        36-48        18-19
#: 16 channels, nearest / trilinear           3.5 / 16     1.3 / 2.4
#: ========================================  ===========  ==========
#:
#: so the loop's start pays back from ~18-35 M labels through a field and ~10-60 M image samples
#: per thread. The rule counts at most :data:`NUMPY_THREADS` threads: NumPy's Python share of a
#: slab (~0.2 ms of ~200 calls, ~6 ns a voxel) holds the GIL, which bounds how many it can use
#: (not measured past 2 cores: ``tests/benchmarks/bench_resample_threads.py``). A 1 mm atlas
#: (7.2 M labels) is thus always drawn with NumPy; a 4-D image of 100 M samples on 4 threads with
#: the loop. Benchmarks set both to 0 to force the loop.
COMPILED_START_SAMPLES = {0: 40_000_000, 1: 16_000_000}
#: The most threads the rule above credits to the NumPy path.
NUMPY_THREADS = 8
#: Output voxels per slab on the GPU (float64 coordinates and temporaries: ~0.5 GB).
GPU_SLAB_VOXELS = 1 << 23


def resolve_device(device: str | Backend) -> Backend:
    """The backend ``device`` means for a resampling. ``auto`` takes the GPU when CuPy is already
    running in this process (the window, a batch worker), else the CPU: a whole-brain resampling
    takes tenths of a second on the CPU, less than starting CuPy and a CUDA context in a fresh
    command."""
    if isinstance(device, Backend) or (device or "auto").lower() != "auto":
        return get_backend(device)
    if "cupy" in sys.modules:
        return get_backend("auto")
    return get_backend("cpu")


def _corners(xp, coords, shape):
    """Per axis: the lower corner index (int64), the upper one (clamped), the weight of the upper
    one, and whether the coordinate lies in ``[0, n - 1]``."""
    out = []
    inside = None
    for d in range(3):
        c = coords[d]
        ok = (c >= 0) & (c <= shape[d] - 1)
        inside = ok if inside is None else inside & ok
        c = xp.where(ok, c, 0.0)  # NaN or far outside: read nothing (the voxel gets cval)
        base = xp.floor(c)
        frac = c - base
        lo = xp.clip(base, 0, shape[d] - 1).astype(xp.int64)
        hi = xp.minimum(lo + 1, shape[d] - 1)
        out.append((lo, hi, frac))
    return out, inside


def sample(xp, volume, coords, order: int, cval: float = 0.0):
    """``volume`` (3-D) at continuous voxel coordinates ``coords`` (3, N): trilinear (``order=1``,
    float64 values) or nearest (``order=0``, the volume's dtype); ``cval`` outside ``[0, n - 1]``."""
    shape = volume.shape
    flat = volume.reshape(-1)
    sy, sx = shape[2], shape[1] * shape[2]
    if order == 0:
        inside = None
        index = None
        for d, stride in enumerate((sx, sy, 1)):
            c = coords[d]
            ok = (c >= 0) & (c <= shape[d] - 1)
            inside = ok if inside is None else inside & ok
            part = xp.floor(xp.where(ok, c, 0.0) + 0.5).astype(xp.int64) * stride
            index = part if index is None else index + part
        values = xp.take(flat, index)
        return xp.where(inside, values, xp.asarray(cval, dtype=values.dtype))
    ((x0, x1, fx), (y0, y1, fy), (z0, z1, fz)), inside = _corners(xp, coords, shape)
    out = None
    for cx, wx in ((x0 * sx, 1.0 - fx), (x1 * sx, fx)):
        for cy, wy in ((y0 * sy, 1.0 - fy), (y1 * sy, fy)):
            row, wxy = cx + cy, wx * wy
            for cz, wz in ((z0, 1.0 - fz), (z1, fz)):
                term = (wxy * wz) * xp.take(flat, row + cz)
                out = term if out is None else out + term
    return xp.where(inside, out, xp.asarray(cval, dtype=out.dtype))


def source_coordinates(xp, shape, i0: int, i1: int, linear, field=None, at_field=None, step=None):
    """Source voxel coordinates (3, N) of the output voxels in planes ``i0:i1`` (C order); ``field``
    as its three components (each (FX, FY, FZ), C-contiguous) or None."""
    ny, nz = shape[1], shape[2]
    i = xp.arange(i0, i1, dtype=xp.float64)[:, None, None]
    j = xp.arange(ny, dtype=xp.float64)[None, :, None]
    k = xp.arange(nz, dtype=xp.float64)[None, None, :]

    def mapped(m):
        return [(m[d][0] * i + m[d][1] * j + m[d][2] * k + m[d][3]).reshape(-1) for d in range(3)]

    src = mapped(np.asarray(linear, np.float64).tolist())
    if field is not None:
        at = mapped(np.asarray(at_field, np.float64).tolist())
        q = np.asarray(step, np.float64).tolist()
        w = [sample(xp, component, at, 1, 0.0) for component in field]
        src = [src[d] + q[d][0] * w[0] + q[d][1] * w[1] + q[d][2] * w[2] for d in range(3)]
    return src


def _slab(xp, channels, shape, i0, i1, linear, field, at_field, step, order, cval, out_dtype):
    """The output planes ``i0:i1`` (``(i1 - i0, ny, nz, C)``) for every one of ``channels`` (3-D, C-contiguous)."""
    src = source_coordinates(xp, shape, i0, i1, linear, field, at_field, step)
    values = [sample(xp, channel, src, order, cval) for channel in channels]
    return xp.stack(values, axis=-1).astype(out_dtype, copy=False).reshape(i1 - i0, shape[1], shape[2], -1)


def resample_volume(
    data,
    shape: tuple[int, int, int],
    linear,
    field=None,
    at_field=None,
    step=None,
    *,
    order: int = 1,
    cval: float = 0.0,
    device: str | Backend = "cpu",
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """``data`` (X, Y, Z[, C], host array) drawn on an output grid of ``shape`` through the voxel map
    (see the module's docstring), on ``device`` (:func:`resolve_device`). Returns a host array of ``shape`` (plus ``C``):
    float32 for trilinear (float64 data stay float64), the data's dtype for nearest.

    ``linear`` and ``at_field`` are 4x4 (output voxel -> source voxel, output voxel -> field
    voxel), ``step`` 3x3 (field value -> source voxels); ``field`` (FX, FY, FZ, 3) or None.
    ``threads`` (CPU): default :func:`gpu.host.host_threads`."""
    if order not in (0, 1):
        raise ValueError("order is 0 (nearest) or 1 (trilinear)")
    backend = resolve_device(device)
    xp = backend.xp
    data = np.asarray(data)
    extra = data.shape[3:]
    flat = data.reshape(*data.shape[:3], -1)
    if order == 1:
        out_dtype = np.result_type(data.dtype, np.float32)
        flat = flat.astype(out_dtype, copy=False)
    else:
        out_dtype = data.dtype
    shape = tuple(int(n) for n in shape)
    nx, ny, nz = shape
    plane = max(1, ny * nz)
    out = np.empty((*shape, flat.shape[3]), dtype=out_dtype)
    check = cancelled or (lambda: False)
    if backend.is_gpu:
        with backend.activate():
            device_data = [xp.ascontiguousarray(xp.asarray(flat[..., c])) for c in range(flat.shape[3])]
            device_field = None if field is None else [xp.asarray(_component(field, c)) for c in range(3)]
            rows = max(1, GPU_SLAB_VOXELS // plane)
            for i0 in range(0, nx, rows):
                if check():
                    raise Cancelled()
                i1 = min(nx, i0 + rows)
                part = _slab(
                    xp, device_data, shape, i0, i1, linear, device_field, at_field, step, order, cval, out_dtype
                )
                out[i0:i1] = backend.to_host(part)
    elif _compiled_pays(nx * ny * nz * flat.shape[3], threads or host_threads(), order):
        _compiled(flat, out, shape, linear, field, at_field, step, order, cval, threads or host_threads(), check)
    else:
        from .resample_host import resample_on_threads

        resample_on_threads(
            flat, out, shape, linear, field, at_field, step, order, cval, threads or host_threads(), check
        )
    return out.reshape(*shape, *extra)


def _compiled_pays(samples: int, threads: int, order: int) -> bool:
    """Whether the CPU draws ``samples`` (output voxels × channels) with numba's compiled loop rather
    than NumPy: always once the loop is loaded in this process (the window, a batch worker: nothing
    left to start), else from :data:`COMPILED_START_SAMPLES` per thread (at most
    :data:`NUMPY_THREADS` of them); never without numba. numba is imported only when this says yes."""
    if f"{__package__}.resample_loops" not in sys.modules:
        if samples < COMPILED_START_SAMPLES[order] * min(threads, NUMPY_THREADS):
            return False
    return numba_module() is not None


def _component(field, c: int) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(field)[..., c], dtype=np.float32)


def _loops():
    from . import resample_loops

    return resample_loops.resample_planes


def _compiled(flat, out, shape, linear, field, at_field, step, order, cval, threads, check) -> None:
    """The CPU path with numba: one compiled loop per slab of planes, on threads (no GIL)."""
    nx = shape[0]
    flat = np.ascontiguousarray(flat)
    has_field = field is not None
    field = np.ascontiguousarray(field, np.float32) if has_field else np.zeros((1, 1, 1, 3), np.float32)
    linear = np.ascontiguousarray(np.asarray(linear, np.float64)[:3])
    at = np.ascontiguousarray(np.asarray(at_field if has_field else np.eye(4), np.float64)[:3])
    step = np.ascontiguousarray(np.asarray(step if has_field else np.eye(3), np.float64)[:3, :3])
    fill = np.array(cval).astype(out.dtype).item()
    args = (linear, field, has_field, at, step, order, fill)
    kernel = compile_or_uncached(_loops, lambda k: k(flat, out, 0, 0, *args), "resample_loops")
    rows = max(1, -(-nx // (4 * threads)))  # four slabs a thread: planes differ in work at the edges

    def task(i0):
        def run():
            if check():
                raise Cancelled()
            kernel(flat, out, i0, min(nx, i0 + rows), *args)

        return run

    run_parallel([task(i0) for i0 in range(0, nx, rows)], threads)
