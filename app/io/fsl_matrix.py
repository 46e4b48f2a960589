"""probtrackx2's matrix files: ``fdt_matrix{1,2,3}.dot``, their coordinate lists, the
target2 lookup volume, ``fdt_network_matrix`` and ``probtrackx.log``.

FSL's sparse text format (MISCMATHS ``SpMat::Print``): one ``row  col  value`` line per
non-zero, 1-based, column by column, then a last line ``n_rows  n_cols  0`` that gives the
size, so MATLAB's ``spconvert(load('fdt_matrix2.dot'))`` and FSL's readers get the full
shape even when the last rows or columns are empty. Counts are written as integers, lengths
with 8 significant digits. Coordinates are 0-based voxel indices, FSL's order (x fastest,
then y, then z); ``coords_for_fdt_matrix*`` has five columns, ``x y z 0 index`` (the ROI
number, 0 for a volume, and the row's 0-based index), ``tract_space_coords_for_fdt_matrix*``
three. ``--matrix-format npz`` writes the same matrices as SciPy sparse ``.npz`` besides.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import numpy as np

from ..errors import InputError
from ._atomic import atomic_path, write_text_atomic


def fsl_voxel_order(mask: np.ndarray) -> np.ndarray:
    """(n, 3) ijk of a mask's voxels in FSL's loop order (z outer, x inner)."""
    zyx = np.argwhere(np.asarray(mask, dtype=bool).transpose(2, 1, 0))
    return np.ascontiguousarray(zyx[:, ::-1]).astype(np.int64)


def _format_values(values: np.ndarray) -> list[str]:
    if np.issubdtype(values.dtype, np.integer):
        return [str(int(v)) for v in values]
    return [f"{v:.8g}" for v in values]


def write_fdt_matrix(path: str | os.PathLike, rows, cols, values, shape: tuple[int, int]) -> Path:
    """Write a sparse matrix (0-based ``rows``, ``cols``) in FSL's ``.dot`` text format."""
    rows, cols, values = (np.asarray(a) for a in (rows, cols, values))
    nz = values != 0
    rows, cols, values = rows[nz], cols[nz], values[nz]
    order = np.lexsort((rows, cols))  # column by column, as SpMat::Print
    text = _format_values(values[order])
    lines = [f"{r + 1}  {c + 1}  {v}" for r, c, v in zip(rows[order], cols[order], text, strict=True)]
    lines.append(f"{int(shape[0])}  {int(shape[1])}  0")
    return write_text_atomic("\n".join(lines) + "\n", path)


def read_fdt_matrix(path: str | os.PathLike):
    """A ``.dot`` file as a ``scipy.sparse.coo_matrix`` (the size line, when present, sets the
    shape, as ``spconvert`` does)."""
    import scipy.sparse

    try:
        table = np.loadtxt(path, ndmin=2)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"not an FSL sparse matrix (row col value lines): {exc}", path=path, fix="Give an fdt_matrix*.dot file"
        ) from None
    if table.shape[1] != 3:
        raise InputError(
            f"an FSL sparse matrix has 3 columns, this file {table.shape[1]}",
            path=path,
            fix="Give an fdt_matrix*.dot file (row col value per line)",
        )
    shape = None
    if len(table) and table[-1, 2] == 0:
        shape, table = (int(table[-1, 0]), int(table[-1, 1])), table[:-1]
    rows, cols = table[:, 0].astype(np.int64) - 1, table[:, 1].astype(np.int64) - 1
    if shape is None:
        shape = (int(rows.max()) + 1 if len(rows) else 0, int(cols.max()) + 1 if len(cols) else 0)
    return scipy.sparse.coo_matrix((table[:, 2], (rows, cols)), shape=shape)


def write_npz_matrix(path: str | os.PathLike, rows, cols, values, shape: tuple[int, int]) -> Path:
    """The same matrix as a SciPy sparse ``.npz`` (CSR)."""
    import scipy.sparse

    matrix = scipy.sparse.coo_matrix((np.asarray(values), (np.asarray(rows), np.asarray(cols))), shape=shape).tocsr()
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:  # save_npz would add .npz to the temporary name
            scipy.sparse.save_npz(fh, matrix)
    return Path(path)


def write_coords(path: str | os.PathLike, ijk: np.ndarray, *, five_columns: bool = True) -> Path:
    """A coordinate list: ``x y z 0 index`` per row (five columns) or ``x y z``."""
    ijk = np.asarray(ijk, dtype=np.int64).reshape(-1, 3)
    if five_columns:
        ijk = np.concatenate([ijk, np.zeros((len(ijk), 1), np.int64), np.arange(len(ijk))[:, None]], axis=1)
    lines = ["  ".join(str(int(v)) for v in row) for row in ijk]
    return write_text_atomic("".join(line + "\n" for line in lines), path)


def write_ascii_matrix(path: str | os.PathLike, matrix: np.ndarray) -> Path:
    """A dense matrix as FSL's ``write_ascii_matrix`` writes it: a line per row, values
    separated by two spaces."""
    matrix = np.atleast_2d(np.asarray(matrix))
    lines = ["  ".join(_format_values(row)) for row in matrix]
    return write_text_atomic("".join(line + "\n" for line in lines), path)


def write_probtrackx_log(path: str | os.PathLike, argv: list[str]) -> Path:
    """``probtrackx.log``: the command line, as probtrackx2 writes it (one line)."""
    return write_text_atomic(shlex.join(argv) + "\n", path)
