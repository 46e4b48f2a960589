"""The closed-form 3x3 eigensolver against LAPACK, on hard cases, on both backends."""

import numpy as np
import pytest

from tractlens.gpu import sym3
from tractlens.gpu.backend import get_backend


def random_tensors(rng, evals):
    q, _ = np.linalg.qr(rng.normal(size=(len(evals), 3, 3)))
    mats = q @ (evals[:, :, None] * np.swapaxes(q, 1, 2))
    return sym3.from_matrix(np, mats)


def cases(rng, n=20_000):
    tiny = rng.normal(size=n) * 1e-10
    yield "random", sym3.from_matrix(np, (lambda a: a + np.swapaxes(a, 1, 2))(rng.normal(size=(n, 3, 3))))
    yield "prolate", random_tensors(rng, np.stack([np.full(n, 1.7e-3), np.full(n, 3e-4), 3e-4 + tiny], 1))
    yield "oblate", random_tensors(rng, np.stack([np.full(n, 1.7e-3), 1.7e-3 + tiny, np.full(n, 3e-4)], 1))
    yield "near_isotropic", random_tensors(rng, np.stack([1e-3 + tiny * 10, 1e-3 + tiny, 1e-3 - tiny], 1))
    yield "white_matter", random_tensors(rng, np.sort(rng.uniform(1e-4, 2e-3, (n, 3)), 1)[:, ::-1])
    yield "indefinite", random_tensors(rng, np.stack([np.full(n, 1e-3), np.full(n, 1e-4), np.full(n, -2e-4)], 1))


@pytest.mark.parametrize("case", ["random", "prolate", "oblate", "near_isotropic", "white_matter", "indefinite"])
def test_eigh_matches_lapack_and_is_orthonormal(device, case, rng):
    tensor = dict(cases(rng))[case]
    be = get_backend(device)
    evals, evecs = (be.to_host(a) for a in sym3.eigh(be.xp, be.asarray(tensor)))
    mats = sym3.to_matrix(np, tensor)
    ref = np.linalg.eigh(mats)[0][:, ::-1]
    scale = np.abs(ref).max(axis=1)
    # Eigenvalues: absolute error relative to the tensor's size; the trigonometric
    # solution loses about sqrt(eps) only for exactly repeated roots.
    assert np.max(np.abs(evals - ref) / scale[:, None]) < 1e-7
    assert np.all(evals[:, 0] >= evals[:, 1]) and np.all(evals[:, 1] >= evals[:, 2])
    # Eigenvectors: A v = λ v (holds even for repeated roots) and an orthonormal basis.
    residual = np.abs(mats @ evecs - evecs * evals[:, None, :]).max(axis=(1, 2)) / scale
    assert residual.max() < 1e-6
    gram = np.swapaxes(evecs, 1, 2) @ evecs
    assert np.abs(gram - np.eye(3)).max() < 1e-10


def test_eigh_handles_zero_and_diagonal(device):
    be = get_backend(device)
    tensor = np.array([[0, 0, 0, 0, 0, 0], [3, 0, 0, 1, 0, 2], [1, 0, 0, 1, 0, 1]], dtype=float)
    evals, evecs = (be.to_host(a) for a in sym3.eigh(be.xp, be.asarray(tensor)))
    np.testing.assert_allclose(evals, [[0, 0, 0], [3, 2, 1], [1, 1, 1]], atol=1e-14)
    np.testing.assert_allclose(np.abs(evecs[1]), np.eye(3)[:, [0, 2, 1]], atol=1e-12)
    assert np.isfinite(evecs).all()


def test_fa_from_invariants_equals_fa_from_eigenvalues(rng):
    tensor = dict(cases(rng, 1000))["white_matter"]
    evals = np.linalg.eigvalsh(sym3.to_matrix(np, tensor))
    l1, l2, l3 = evals.T
    fa_eig = np.sqrt(0.5 * ((l1 - l2) ** 2 + (l1 - l3) ** 2 + (l2 - l3) ** 2) / (l1**2 + l2**2 + l3**2))
    np.testing.assert_allclose(sym3.fractional_anisotropy_from_invariants(np, tensor), fa_eig, atol=1e-12)


def test_frame_changes_are_consistent(rng):
    tensor = dict(cases(rng, 100))["white_matter"]
    np.testing.assert_array_equal(sym3.flip_x_frame(sym3.flip_x_frame(tensor)), tensor)
    flip = np.diag([-1.0, 1.0, 1.0])
    np.testing.assert_allclose(sym3.rotate(np, tensor, flip), sym3.flip_x_frame(tensor), atol=1e-18)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    back = sym3.rotate(np, sym3.rotate(np, tensor, q), q.T)
    np.testing.assert_allclose(back, tensor, atol=1e-15)
