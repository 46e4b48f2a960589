"""The rigid/affine mutual-information engine of gpu.registration (the GPU path of tractlens register):
its analytic gradient against finite differences, known transforms recovered on the NumPy and CuPy
backends, and agreement with DIPY's AffineRegistration (the CPU path)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.anatomy_synth import anatomy, grid, image_on, rigid
from tractlens.app.pipelines.register import RegisterParams, register_arrays
from tractlens.gpu.backend import get_backend
from tractlens.gpu.registration import MutualInformationRegistration, register_affine

FIXED_G, MOVING_G = grid((36, 40, 32), 3.0), grid((54, 60, 48), 2.0)
TRUTH = rigid(6, -4, 8, (5.0, -4.0, 3.0)) @ np.diag([1.04, 0.97, 1.02, 1.0])  # fixed RAS -> anatomy (moving) RAS


def _head(g):
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in g.shape], indexing="ij"), -1).reshape(-1, 3)
    pts = ijk @ g.affine[:3, :3].T + g.affine[:3, 3]
    return pts[anatomy(pts) > 60]


def _error(a, b, pts):
    return float(np.linalg.norm((pts @ a[:3, :3].T + a[:3, 3]) - (pts @ b[:3, :3].T + b[:3, 3]), axis=1).mean())


@pytest.fixture(scope="module")
def images():
    return image_on(FIXED_G, TRUTH, "t2", noise=2.0), image_on(MOVING_G)


def test_the_analytic_gradient_follows_finite_differences(images):
    fixed, moving = images
    engine = MutualInformationRegistration(get_backend("cpu"), 32)
    level = engine.prepare(fixed, FIXED_G.affine, moving, MOVING_G.affine, 2, 1.0, 0)
    transform = np.eye(4)
    transform[:3, :3] += 0.02
    transform[:3, 3] = [1.0, 2.0, -1.0]
    _, analytic = engine.value_and_gradient(level, transform, np.zeros(3))
    numeric = []
    for k in range(12):
        step = np.zeros(12)
        step[k] = 1e-3
        plus, minus = transform.copy(), transform.copy()
        plus[:3, :3] += step[:9].reshape(3, 3)
        plus[:3, 3] += step[9:]
        minus[:3, :3] -= step[:9].reshape(3, 3)
        minus[:3, 3] -= step[9:]
        numeric.append(
            (
                engine.value_and_gradient(level, plus, np.zeros(3))[0]
                - engine.value_and_gradient(level, minus, np.zeros(3))[0]
            )
            / 2e-3
        )
    numeric = np.array(numeric)
    cosine = analytic @ numeric / (np.linalg.norm(analytic) * np.linalg.norm(numeric))
    # not exact: the image gradient is central differences, not the trilinear interpolant's own slope
    assert cosine > 0.95, (analytic, numeric)
    assert 0.8 < np.linalg.norm(analytic) / np.linalg.norm(numeric) < 1.25


def test_the_engine_recovers_an_affine_transform_across_contrasts(images, device):
    fixed, moving = images
    backend = get_backend(device)
    start = register_affine(fixed, FIXED_G.affine, moving, MOVING_G.affine, np.eye(4), "rigid", iterations=(60, 30),
                            sampling=1.0, backend=backend)  # fmt: skip
    found = register_affine(fixed, FIXED_G.affine, moving, MOVING_G.affine, start, "affine", iterations=(60, 30),
                            sampling=1.0, backend=backend)  # fmt: skip
    assert _error(found, TRUTH, _head(FIXED_G)) < 0.5  # mm, 3 mm voxels


def test_cupy_and_numpy_give_the_same_transform(images):
    pytest.importorskip("cupy")
    fixed, moving = images
    results = []
    for device in ("cpu", "gpu"):
        results.append(register_affine(fixed, FIXED_G.affine, moving, MOVING_G.affine, np.eye(4), "affine",
                                       iterations=(40, 20), sampling=0.5, backend=get_backend(device)))  # fmt: skip
    assert _error(results[0], results[1], _head(FIXED_G)) < 0.05  # float32 sums in another order


test_cupy_and_numpy_give_the_same_transform = pytest.mark.gpu(test_cupy_and_numpy_give_the_same_transform)


def test_the_pipeline_on_either_engine_agrees_with_dipy(images, device):
    fixed, moving = images
    params = RegisterParams(type="affine", spacing_mm=3.0, sampling=1.0, affine_iterations=(60, 30))
    ours = register_arrays(moving, MOVING_G, fixed, FIXED_G, params, device=device)
    theirs = register_arrays(moving, MOVING_G, fixed, FIXED_G, params, device="cpu")
    if device == "gpu":
        assert "CuPy" in ours.engine
    assert "DIPY" in theirs.engine
    head = _head(FIXED_G)
    assert _error(ours.registration.affine, TRUTH, head) < 0.5
    assert _error(theirs.registration.affine, TRUTH, head) < 0.5
    assert _error(ours.registration.affine, theirs.registration.affine, head) < 0.6
