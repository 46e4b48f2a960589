"""Indices of the true (non-zero) elements of an array, with the same GPU kernels whatever its size or shape.

CuPy compiles its kernels at first use (NVRTC), and its ``nonzero``/``flatnonzero``
(``cupy/_core/_routines_indexing.pyx``, ``_ndarray_argwhere``) takes one of two disjoint
kernel sets by the array's size: ``cupy_nonzero_kernel`` for 512 elements or fewer, the
"incomplete scan" (``cupy_nonzero_kernel_incomplete_scan`` with its block sums) above. Each is
also compiled anew for every number of dimensions. The same command on data of another size
or shape (a seed ROI of 40 voxels instead of a whole brain; peaks of 40 voxels instead of
4,000) then compiles kernels that neither the shipped kernels nor the first-start rehearsal
prepared (``app.kernel_cache``, ``app.rehearsal``).

Here every array is flattened to one dimension, and one of :data:`CUPY_NONZERO_SMALL` elements
or fewer is padded with zeros beyond that size, so CuPy always runs its incomplete scan over
a one-dimensional boolean array: one set of kernels. The padding is a device-to-device copy
(memcpy: no kernel) of at most 513 elements; longer arrays are not copied (the scan needs no
more memory than CuPy's own).
N-dimensional indices are the flat ones divided out (:func:`nonzero`). On NumPy these are
NumPy's own functions.
"""

from __future__ import annotations

import numpy as np

#: CuPy's size limit for its small-array ``nonzero`` kernel (``chunk_size`` in
#: ``_ndarray_argwhere``: the incomplete scan runs where ``size > chunk_size``). The GPU test
#: ``tests/test_indices_gpu.py`` fails if a CuPy changes it.
CUPY_NONZERO_SMALL = 512


def flatnonzero(xp, a):
    """``xp.flatnonzero(a)``: int64 indices of the non-zero elements of ``a`` raveled, ascending.
    On CuPy the kernels do not depend on ``a``'s size or number of dimensions (module docstring)."""
    if xp is np:
        return np.flatnonzero(a)
    flat = a.ravel()
    if flat.size <= CUPY_NONZERO_SMALL:
        # copied by memcpy, not by an elementwise kernel: CuPy compiles its copy kernel anew for a
        # one-element array (its dimensions of extent 1 are dropped: a 0-d kernel)
        flat = xp.ascontiguousarray(flat)
        padded = xp.zeros(CUPY_NONZERO_SMALL + 1, dtype=flat.dtype)
        if flat.size:
            _copy_prefix(padded, flat)
        flat = padded
    if flat.dtype != np.bool_:
        flat = flat != 0
    return xp.flatnonzero(flat)


def _copy_prefix(dst, src) -> None:
    """``dst[:src.size] = src``: a device-to-device memcpy on CuPy (no kernel), an assignment on
    arrays without device memory (the CPU test's stand-in)."""
    memcpy = getattr(dst.data, "copy_from_device_async", None)
    if memcpy is None:
        dst[: src.size] = src
    else:
        memcpy(src.data, src.nbytes)


def nonzero(xp, a) -> tuple:
    """``xp.nonzero(a)``: a tuple of int64 index arrays, one per dimension of ``a`` (row-major
    order, as NumPy's), with :func:`flatnonzero`'s kernels on CuPy."""
    if xp is np:
        return np.nonzero(a)
    if a.ndim == 0:
        raise ValueError("nonzero of a 0-d array: use atleast_1d first")
    flat = flatnonzero(xp, a)
    coordinates = []
    for extent in reversed(a.shape[1:]):
        coordinates.append(flat % extent)
        flat = flat // extent
    coordinates.append(flat)
    return tuple(reversed(coordinates))
