"""Signal compartments that models compose from, written once over ``xp`` (NumPy or CuPy).

Every function returns the normalised signal (attenuation) E (N, M) of N voxels for the
M measurements of an :class:`~.declare.Acquisition`; per-voxel parameters are (N, 1)
columns (or scalars, for fixed values), diffusivities in mm²/s, b-values in s/mm².

* ball: E = exp(−b d)
* stick along v: E = exp(−b d (g·v)²)
* zeppelin along v: E = exp(−b [d⊥ + (d∥ − d⊥)(g·v)²])
* Watson-dispersed stick (Zhang et al. 2012): E = ∫ W(n; v, κ) exp(−b d (g·n)²) dn as the
  Legendre series Σ_l (4l+1) w_2l(κ) s_2l(b d) P_2l(g·v) up to order 12, NODDI toolbox style
  (:mod:`.special`).
* Watson-dispersed zeppelin: the zeppelin whose tensor is averaged over the Watson
  distribution (the NODDI toolbox's hindered compartment): d∥' = d⊥ + (d∥ − d⊥)⟨t²⟩,
  d⊥' = d⊥ + (d∥ − d⊥)(1 − ⟨t²⟩)/2.
* Bingham-dispersed stick (Tariq et al. 2016): E = c(B − b d g gᵀ) / c(B) with
  B = −κ1 v1 v1ᵀ − κ2 v2 v2ᵀ (κ1 ≥ κ2 ≥ 0), c the Bingham normalising constant.
* Bingham-dispersed zeppelin: the tensor averaged over the Bingham distribution.
"""

from __future__ import annotations

from .special import (
    bingham_moments,
    legendre_even,
    log_bingham_constant,
    stick_coefficients,
    sym3_eigenvalues,
    watson_coefficients,
    watson_second_moment,
)


def unit_vector(xp, theta, phi):
    """(x, y, z) components of the unit vector of polar angle θ and azimuth φ."""
    st = xp.sin(theta)
    return st * xp.cos(phi), st * xp.sin(phi), xp.cos(theta)


def frame(xp, theta, phi, psi):
    """Orthonormal frame (v, v1, v2) of a Bingham distribution: v the mean orientation (θ, φ),
    v1 the concentrated axis and v2 the dispersed one in the plane ⟂ v, rotated by ψ from e_θ."""
    st, ct, sp, cp = xp.sin(theta), xp.cos(theta), xp.sin(phi), xp.cos(phi)
    v = (st * cp, st * sp, ct)
    e_theta = (ct * cp, ct * sp, -st)
    e_phi = (-sp, cp, xp.zeros_like(phi))
    cs, sn = xp.cos(psi), xp.sin(psi)
    v1 = tuple(cs * a + sn * b for a, b in zip(e_theta, e_phi))
    v2 = tuple(-sn * a + cs * b for a, b in zip(e_theta, e_phi))
    return v, v1, v2


def cosine(acq, v):
    """g·v (N, M) for a direction given by its components (each (N, 1))."""
    g = acq.bvecs_xp
    return g[:, 0] * v[0] + g[:, 1] * v[1] + g[:, 2] * v[2]


def ball(xp, acq, d):
    return xp.exp(-acq.bvals_xp * d)


def stick(xp, acq, d, theta, phi):
    c = cosine(acq, unit_vector(xp, theta, phi))
    return xp.exp(-acq.bvals_xp * d * c * c)


def zeppelin(xp, acq, d_par, d_perp, theta, phi):
    c = cosine(acq, unit_vector(xp, theta, phi))
    return xp.exp(-acq.bvals_xp * (d_perp + (d_par - d_perp) * c * c))


def watson_stick(xp, acq, d, kappa, theta, phi):
    """Watson-dispersed stick; ``kappa`` (N, 1) concentration, ``d`` scalar or (N, 1)."""
    c = cosine(acq, unit_vector(xp, theta, phi))
    w = watson_coefficients(xp, kappa)  # (N, L)
    s = stick_coefficients(xp, acq.bvals_xp * d)  # (M, L) or (N, M, L)
    legendre = legendre_even(xp, c)
    total = 0.0
    for order, p in enumerate(legendre):
        total = total + (4 * order + 1) * w[:, order : order + 1] * s[..., order] * p
    return xp.maximum(total, 0.0)


def watson_zeppelin(xp, acq, d_par, d_perp, kappa, theta, phi):
    """Zeppelin whose tensor is averaged over the Watson distribution (NODDI's hindered compartment)."""
    t2 = watson_second_moment(xp, kappa)
    par = d_perp + (d_par - d_perp) * t2
    perp = d_perp + (d_par - d_perp) * (1.0 - t2) / 2.0
    return zeppelin(xp, acq, par, perp, theta, phi)


def bingham_stick(xp, acq, d, kappa1, kappa2, theta, phi, psi):
    """Bingham-dispersed stick, κ1 ≥ κ2 ≥ 0 the concentrations across v1 and v2."""
    _v, v1, v2 = frame(xp, theta, phi, psi)
    g = acq.bvecs_xp
    x = acq.bvals_xp * d  # (M,) or (N, M)

    def entry(i, j):
        return -kappa1 * v1[i] * v1[j] - kappa2 * v2[i] * v2[j] - x * g[:, i] * g[:, j]

    la, lb, lc = sym3_eigenvalues(xp, entry(0, 0), entry(1, 1), entry(2, 2), entry(0, 1), entry(0, 2), entry(1, 2))
    zero = xp.zeros_like(kappa1)
    return xp.exp(log_bingham_constant(xp, la, lb, lc) - log_bingham_constant(xp, -kappa1, -kappa2, zero))


def bingham_zeppelin(xp, acq, d_par, d_perp, kappa1, kappa2, theta, phi, psi):
    """Zeppelin whose tensor d⊥ I + (d∥ − d⊥) ⟨n nᵀ⟩ is averaged over the Bingham distribution."""
    v, v1, v2 = frame(xp, theta, phi, psi)
    m1, m2, m3 = bingham_moments(xp, kappa1, kappa2)
    c, c1, c2 = cosine(acq, v), cosine(acq, v1), cosine(acq, v2)
    projected = m3 * c * c + m1 * c1 * c1 + m2 * c2 * c2
    return xp.exp(-acq.bvals_xp * (d_perp + (d_par - d_perp) * projected))
