"""How a session's side files hold a layer's arrays exactly.

NIfTI-1 has no bool, float16 or (without an explicit type) 64-bit integer: such volumes are
written in a NIfTI type that holds every value (or as ``.npy`` past 32 bits) and the manifest
keeps the layer's own dtype, which reading restores. TRX writes no array of a 0-streamline
tractogram, so the manifest keeps the scalars' names, dtypes and columns too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .tractogram import Tractogram

#: dtypes NIfTI-1 holds as they are (nibabel refuses bool and float16, and int64 without an explicit type)
NIFTI_NATIVE = frozenset(
    np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.float32, np.float64)
)


def nifti_storable(array: np.ndarray) -> np.ndarray | None:
    """``array`` in a dtype NIfTI-1 holds exactly (cast back on reading), or None when no such
    dtype holds all its values (64-bit integers beyond 32 bits, complex): those go to ``.npy``."""
    dtype = array.dtype
    if dtype in NIFTI_NATIVE:
        return array
    if dtype.kind == "b":
        return array.view(np.uint8)
    if dtype == np.float16:
        return array.astype(np.float32)
    if dtype.kind in "iu":
        lo, hi = (int(array.min()), int(array.max())) if array.size else (0, 0)
        for candidate in (np.int32, np.uint32):
            info = np.iinfo(candidate)
            if info.min <= lo and hi <= info.max:
                return array.astype(candidate)
    return None


def in_layer_dtype(array: np.ndarray, dtype: str) -> np.ndarray:
    """A side file's values back in the layer's own dtype (recorded in the manifest)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biufc":
        raise ValueError(f"a side file has an invalid type {dtype}")
    return np.asarray(array).astype(dtype, copy=False)


def scalar_types(tract: Tractogram) -> dict:
    """The tractogram's scalars as ``{"point"|"streamline": {name: [dtype, columns]}}`` (JSON)."""
    return {
        kind: {key: [np.asarray(v).dtype.str, list(np.shape(v)[1:])] for key, v in values.items()}
        for kind, values in (("point", tract.point_scalars), ("streamline", tract.streamline_scalars))
    }


def restore_empty_scalars(tract: Tractogram, scalars: dict) -> None:
    """The scalars of an empty tractogram, as 0-length arrays of their own dtype and columns."""
    for kind, target in (("point", tract.point_scalars), ("streamline", tract.streamline_scalars)):
        for key, (dtype, columns) in dict(scalars.get(kind) or {}).items():
            target.setdefault(str(key), np.zeros((0, *(int(c) for c in columns)), np.dtype(dtype)))


def jsonable(value):
    """``value`` with NumPy arrays and scalars, paths and non-finite floats made JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
