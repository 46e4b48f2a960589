"""gpu/indices.py: the indices of true elements with one set of CuPy kernels whatever the size.

The CuPy path (padding short arrays past CuPy's small-array limit, flat indices divided out
into coordinates) runs here on NumPy arrays through a stand-in array module that is not NumPy
itself, so its logic is checked on the CPU; tests/test_indices_gpu.py runs it on CuPy and
counts the kernels it compiles."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest

from tractlens.gpu import indices

ROOT = Path(__file__).resolve().parents[1]

#: NumPy under another name: ``indices`` then takes its CuPy path.
NOT_NUMPY = types.SimpleNamespace(zeros=np.zeros, flatnonzero=np.flatnonzero, ascontiguousarray=np.ascontiguousarray)
SIZES = (0, 1, 2, 40, 511, 512, 513, 514, 3000)


@pytest.mark.parametrize("size", SIZES)
def test_flatnonzero_on_the_cupy_path_equals_numpys_for_every_size(size):
    rng = np.random.default_rng(size)
    mask = rng.random(size) < 0.3
    got = indices.flatnonzero(NOT_NUMPY, mask)
    np.testing.assert_array_equal(got, np.flatnonzero(mask))
    assert got.dtype == np.int64


def test_flatnonzero_on_the_cupy_path_takes_numbers_and_many_dimensions():
    values = np.array([[0.0, 1.5, 0.0], [-2.0, 0.0, np.nan]])
    np.testing.assert_array_equal(indices.flatnonzero(NOT_NUMPY, values), np.flatnonzero(values))
    every = np.ones(600, bool)  # all true past the padding: nothing of the padding leaks in
    np.testing.assert_array_equal(indices.flatnonzero(NOT_NUMPY, every), np.arange(600))
    short = np.ones(7, bool)
    np.testing.assert_array_equal(indices.flatnonzero(NOT_NUMPY, short), np.arange(7))


@pytest.mark.parametrize("shape", [(5,), (40, 3), (300, 3), (7, 2, 11), (2, 3, 4, 5), (0, 3)])
def test_nonzero_on_the_cupy_path_equals_numpys_for_every_shape(shape):
    rng = np.random.default_rng(len(shape))
    mask = rng.random(shape) < 0.4
    got = indices.nonzero(NOT_NUMPY, mask)
    expected = np.nonzero(mask)
    assert len(got) == len(expected) == len(shape)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_on_numpy_they_are_numpys_own():
    mask = np.array([[True, False], [False, True]])
    np.testing.assert_array_equal(indices.flatnonzero(np, mask), [0, 3])
    rows, cols = indices.nonzero(np, mask)
    np.testing.assert_array_equal(rows, [0, 1])
    np.testing.assert_array_equal(cols, [0, 1])
    with pytest.raises(ValueError, match="0-d"):
        indices.nonzero(NOT_NUMPY, np.array(True))


def _array_module_calls(path: Path) -> list[str]:
    """``xp.nonzero(...)``-like calls of a module on an array module other than NumPy."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, ast.unparse(node.func.value)
        if owner in ("np", "numpy"):
            continue
        size_dependent = name in ("nonzero", "flatnonzero", "argwhere") or (name == "where" and len(node.args) == 1)
        if size_dependent and owner != "indices":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{name}")
    return found


def test_the_engine_finds_true_elements_only_through_gpu_indices():
    """CuPy's own nonzero/flatnonzero/argwhere/where(cond) compile other kernels for arrays of
    512 elements or fewer and for each number of dimensions: the engine goes through
    gpu/indices.py, so a first run on data of another size compiles nothing."""
    calls = [c for p in sorted((ROOT / "gpu").rglob("*.py")) if p.name != "indices.py" for c in _array_module_calls(p)]
    assert calls == []
