"""The tensor field the tracking reads: its FA, fitted voxels and the count of tensors that are
not positive definite, checked against the plain computation over every voxel."""

import numpy as np
import pytest

from tractlens.app.pipelines.tensor_field import TensorField, count_not_positive_definite
from tractlens.gpu import sym3


def _eigvalsh_count(tensors: np.ndarray) -> int:
    """The reference: decompose every tensor."""
    t = np.asarray(tensors, np.float64)
    a, b, c, d, e, f = (t[:, i] for i in range(6))
    m = np.stack([np.stack([a, b, c], -1), np.stack([b, d, e], -1), np.stack([c, e, f], -1)], -2)
    return int((np.linalg.eigvalsh(m)[:, 0] <= 0).sum()) if len(t) else 0


def _six(matrices: np.ndarray) -> np.ndarray:
    m = matrices
    return np.stack([m[:, 0, 0], m[:, 0, 1], m[:, 0, 2], m[:, 1, 1], m[:, 1, 2], m[:, 2, 2]], -1)


def _tensors(rng, n: int) -> np.ndarray:
    """Brain-like tensors, some not positive definite, some singular or at the edge, in float32."""
    q, _ = np.linalg.qr(rng.normal(size=(n, 3, 3)))
    evals = np.sort(rng.uniform(1e-4, 2e-3, size=(n, 3)), axis=1)
    kind = rng.integers(0, 6, n)
    evals[kind == 1, 0] *= -1  # one negative eigenvalue
    evals[kind == 2, 0] = 0.0  # singular (rank 2)
    evals[kind == 3, :2] = 0.0  # rank 1: a single fibre's stick
    evals[kind == 4, 0] = evals[kind == 4, 2] * rng.choice([1e-7, -1e-7, 1e-9, 1e-11], (kind == 4).sum())
    evals[kind == 5] *= -1  # negative definite
    matrices = np.einsum("nij,nj,nkj->nik", q, evals, q)
    return _six(matrices).astype(np.float32)


@pytest.mark.parametrize("seed", range(6))
def test_not_positive_definite_count_is_eigvalsh_count(seed):
    rng = np.random.default_rng(seed)
    tensors = _tensors(rng, 20000)
    expected = _eigvalsh_count(tensors)
    assert 0 < expected < len(tensors)  # both kinds are there
    assert count_not_positive_definite(tensors) == expected


def test_not_positive_definite_count_edges():
    assert count_not_positive_definite(np.zeros((0, 6), np.float32)) == 0
    identity = np.array([[1, 0, 0, 1, 0, 1]], np.float32)
    assert count_not_positive_definite(identity * 7e-4) == 0
    assert count_not_positive_definite(np.zeros((3, 6), np.float32)) == 3  # eigenvalue 0 counts
    assert count_not_positive_definite(-identity) == 1
    # positive diagonal, negative determinant: Sylvester's last minor decides
    assert count_not_positive_definite(np.array([[1, 0.9, 0.9, 1, -0.9, 1]], np.float32)) == 1
    # tiny and huge scales are judged alike (the test is relative to the largest component)
    assert count_not_positive_definite(np.array([[1e-30, 0, 0, 1e-30, 0, 1e-30]], np.float32)) == 0
    assert count_not_positive_definite(np.array([[1e30, 0, 0, 1e30, 0, 1e30]], np.float32)) == 0


def test_tensor_field_matches_the_whole_volume_computation():
    rng = np.random.default_rng(7)
    shape = (9, 8, 7)
    tensor = _tensors(rng, int(np.prod(shape))).reshape(*shape, 6)
    tensor[0] = 0.0  # background
    tensor[1, 1, 1, 2] = np.nan
    tensor[2, 2, 2, 0] = np.inf
    tensor[3, 3, 3] = np.float32(1e-42)  # a subnormal but nonzero tensor is fitted
    field_ = TensorField.from_tensor(tensor, np.eye(4), "t")

    finite = np.isfinite(tensor).all(-1)
    clean = np.where(finite[..., None], tensor, 0.0)
    mask = finite & (np.abs(clean).sum(-1) > 0)
    fa = np.clip(sym3.fractional_anisotropy_from_invariants(np, clean.astype(np.float64)), 0, 1).astype(np.float32)
    np.testing.assert_array_equal(field_.mask, mask)
    np.testing.assert_array_equal(field_.fa, fa)
    assert field_.fa.dtype == np.float32
    assert field_.not_positive_definite == _eigvalsh_count(clean[mask])
    assert any("2 voxels have NaN or infinite" in note for note in field_.notes)
    assert any(f"{field_.not_positive_definite} voxels have tensors that are not positive" in n for n in field_.notes)


def test_tensor_field_of_a_clean_volume_has_no_notes():
    tensor = np.zeros((4, 4, 4, 6), np.float32)
    tensor[1:3, 1:3, 1:3] = [1.7e-3, 0, 0, 3e-4, 0, 3e-4]
    field_ = TensorField.from_tensor(tensor, np.eye(4))
    assert field_.notes == [] and field_.not_positive_definite == 0
    assert field_.mask.sum() == 8
    assert np.allclose(field_.fa[1:3, 1:3, 1:3], 0.8, atol=0.01) and field_.fa[0].max() == 0
