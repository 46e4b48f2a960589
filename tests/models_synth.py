"""Synthetic multi-shell acquisitions and NODDI voxels from known parameters (our NumPy forward model)."""

from __future__ import annotations

import numpy as np

from tractlens.gpu.models import Acquisition, Model
from tractlens.gpu.models.optimize import predict


def sphere_points(n: int, rng) -> np.ndarray:
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def multishell(rng, shells=(1000.0, 2000.0, 3000.0), per_shell: int = 90, b0: int = 6):
    """b-values and unit directions: ``b0`` b=0 volumes, then ``per_shell`` random directions per shell."""
    bvals = np.concatenate([np.zeros(b0)] + [np.full(per_shell, b) for b in shells])
    bvecs = np.concatenate([np.zeros((b0, 3))] + [sphere_points(per_shell, rng) for _ in shells])
    return bvals, bvecs


def random_orientations(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    return np.arccos(rng.uniform(-1, 1, n)), rng.uniform(-np.pi, np.pi, n)


def noddi_watson_truth(n: int, rng, s0: float = 100.0) -> np.ndarray:
    """(n, 6) values in the model's order: S0, v_ic, odi, v_iso, θ, φ (white-matter-like ranges)."""
    theta, phi = random_orientations(n, rng)
    return np.column_stack(
        [np.full(n, s0), rng.uniform(0.3, 0.8, n), rng.uniform(0.05, 0.6, n), rng.uniform(0.0, 0.3, n), theta, phi]
    )


def noisy_signal(model: Model, truth: np.ndarray, bvals, bvecs, rng, snr: float = 30.0) -> np.ndarray:
    """Rician-noise signals (n, M) at SNR ``snr`` relative to S0."""
    clean = predict(np, model, Acquisition(bvals, bvecs), truth)
    sigma = truth[:, :1] / snr
    real = clean + rng.normal(size=clean.shape) * sigma
    imag = rng.normal(size=clean.shape) * sigma
    return np.sqrt(real * real + imag * imag)


def angle_deg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angle (degrees, axial) between unit vectors (n, 3)."""
    return np.degrees(np.arccos(np.clip(np.abs((a * b).sum(axis=1)), 0.0, 1.0)))


def unit(theta, phi) -> np.ndarray:
    return np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], axis=1)
