"""Special functions of the dispersed compartments, written once over ``xp`` (NumPy or CuPy).

* Modified Bessel functions ``I0``/``I1``, exponentially scaled, by the rational
  approximations of Abramowitz & Stegun 9.8.1–9.8.4 (relative error < 2e-7).
* A fixed, graded composite Gauss–Legendre rule on [0, 1] (:data:`NODES`): its panels
  crowd towards t = 1, where the integrands below peak with width ~1/κ, so 60 nodes
  integrate them to ~1e-9 for concentrations up to several hundred (measured against 360 nodes).
* Watson distribution: its Legendre (zonal spherical-harmonic) coefficients up to order 12,
  the truncation the NODDI toolbox uses (``WatsonSHCoeff``), and the second moment ⟨(μ·n)²⟩
  of the dispersed-tensor (tortuous zeppelin) compartment (``WatsonHinderedDiffusionCoeff``).
  The toolbox evaluates these integrals in closed form through Dawson's function with Taylor
  branches for small κ; we evaluate the same integrals ∫₀¹ e^{κ(t²−1)} P_l(t) dt by the
  quadrature above, which is stable for every κ (tests compare with the closed forms).
* Bingham normalising constant c(A) = ∫_{S²} exp(nᵀ A n) dn of a symmetric 3×3 matrix with
  eigenvalues λa ≤ λb ≤ λc, as the exact one-dimensional integral (t along the eigenvector
  of λc, the azimuth integrated in closed form):

      c(A) = 4π e^{λc} ∫₀¹ exp((1 − t²)(λb − λc)) · i0e((1 − t²)(λb − λa)/2) dt,

  by the same quadrature (i0e the scaled Bessel function). The NODDI-Bingham toolbox and
  cuDIMOT approximate c instead (Kume & Wood's saddle point, ~1 % error); this is exact to
  the quadrature's accuracy, and cheap because it is one dimensional.
"""

from __future__ import annotations

import itertools

import numpy as np

#: Highest even Legendre order of the Watson series (the NODDI toolbox's truncation).
WATSON_ORDER = 12

_PANELS = (0.0, 0.5, 0.8, 0.93, 0.98, 0.995, 1.0)
_PER_PANEL = 10


def _graded_rule() -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(_PER_PANEL)
    nodes, weights = [], []
    for lo, hi in itertools.pairwise(_PANELS):
        nodes.append(lo + (hi - lo) * (x + 1.0) / 2.0)
        weights.append(w * (hi - lo) / 2.0)
    return np.concatenate(nodes), np.concatenate(weights)


#: Nodes and weights of the composite Gauss–Legendre rule on [0, 1].
NODES, WEIGHTS = _graded_rule()


def legendre_even(xp, t, order: int = WATSON_ORDER):
    """P_0, P_2, …, P_order of ``t`` (any shape) as a list, by Bonnet's recursion."""
    out = [xp.ones_like(t)]
    p_prev, p = xp.ones_like(t), t
    for n in range(1, order):
        p_prev, p = p, ((2 * n + 1) * t * p - n * p_prev) / (n + 1)
        if (n + 1) % 2 == 0:
            out.append(p)
    return out


#: Legendre polynomials at the quadrature nodes: (orders, nodes), host constants.
P_AT_NODES = np.stack(legendre_even(np, NODES))


def i0e(xp, x):
    """exp(−|x|) I0(x) (A&S 9.8.1, 9.8.2)."""
    ax = xp.abs(x)
    small = ax < 3.75
    t = (xp.where(small, ax, 0.0) / 3.75) ** 2
    p = 0.0045813
    for c in (0.0360768, 0.2659732, 1.2067492, 3.0899424, 3.5156229, 1.0):
        p = p * t + c
    xs = xp.where(small, 3.75, ax)
    u = 3.75 / xs
    q = 0.00392377
    for c in (-0.01647633, 0.02635537, -0.02057706, 0.00916281, -0.00157565, 0.00225319, 0.01328592, 0.39894228):
        q = q * u + c
    return xp.where(small, p * xp.exp(-ax), q / xp.sqrt(xs))


def i1e(xp, x):
    """exp(−|x|) I1(x) (A&S 9.8.3, 9.8.4), odd in x."""
    ax = xp.abs(x)
    small = ax < 3.75
    t = (xp.where(small, ax, 0.0) / 3.75) ** 2
    p = 0.00032411
    for c in (0.00301532, 0.02658733, 0.15084934, 0.51498869, 0.87890594, 0.5):
        p = p * t + c
    xs = xp.where(small, 3.75, ax)
    u = 3.75 / xs
    q = -0.00420059
    for c in (0.01787654, -0.02895312, 0.02282967, -0.01031555, 0.00163801, -0.00362018, -0.03988024, 0.39894228):
        q = q * u + c
    value = xp.where(small, ax * p * xp.exp(-ax), q / xp.sqrt(xs))
    return xp.where(x < 0, -value, value)


def watson_coefficients(xp, kappa):
    """Normalised Legendre coefficients of the Watson density exp(κ (μ·n)²).

    ``kappa`` (N, 1). Returns (N, L) with L = ``WATSON_ORDER // 2 + 1``:
    w_l = ∫₀¹ e^{κt²} P_2l(t) dt / ∫₀¹ e^{κt²} dt (w_0 = 1).
    """
    t = xp.asarray(NODES)
    weights = xp.asarray(WEIGHTS)
    density = xp.exp(kappa * (t * t - 1.0)) * weights  # (N, nodes); the e^{−κ} cancels in the ratio
    moments = density @ xp.asarray(P_AT_NODES.T)  # (N, L)
    return moments / moments[:, :1]


def watson_second_moment(xp, kappa):
    """⟨(μ·n)²⟩ under the Watson distribution of concentration ``kappa`` (any shape)."""
    t = xp.asarray(NODES)
    density = xp.exp(kappa[..., None] * (t * t - 1.0)) * xp.asarray(WEIGHTS)
    return (density * t * t).sum(axis=-1) / density.sum(axis=-1)


def stick_coefficients(xp, x):
    """∫₀¹ e^{−x t²} P_2l(t) dt for ``x`` = b·d (any shape): (..., L), Legendre orders 0..12."""
    t = xp.asarray(NODES)
    profile = xp.exp(-x[..., None] * (t * t)) * xp.asarray(WEIGHTS)
    return profile @ xp.asarray(P_AT_NODES.T)


def sym3_eigenvalues(xp, a11, a22, a33, a12, a13, a23):
    """Eigenvalues λa ≤ λb ≤ λc of symmetric 3×3 matrices given by their six entries (arrays
    of one shape), by the trigonometric closed form (Smith 1961)."""
    q = (a11 + a22 + a33) / 3.0
    off = a12 * a12 + a13 * a13 + a23 * a23
    b11, b22, b33 = a11 - q, a22 - q, a33 - q
    p = xp.sqrt(xp.maximum((b11 * b11 + b22 * b22 + b33 * b33 + 2.0 * off) / 6.0, 1e-300))
    det = b11 * (b22 * b33 - a23 * a23) - a12 * (a12 * b33 - a23 * a13) + a13 * (a12 * a23 - b22 * a13)
    r = xp.clip(det / (2.0 * p**3), -1.0, 1.0)
    phi = xp.arccos(r) / 3.0
    top = q + 2.0 * p * xp.cos(phi)
    bottom = q + 2.0 * p * xp.cos(phi + 2.0 * np.pi / 3.0)
    return bottom, 3.0 * q - top - bottom, top


def log_bingham_constant(xp, la, lb, lc):
    """log c(A) − log 4π for eigenvalues la ≤ lb ≤ lc (arrays of one shape); see the module text.

    The quadrature nodes are looped over (60 of them) so memory stays at the arrays' size."""
    total = xp.zeros_like(la)
    gap_b, half_ab = lb - lc, (lb - la) / 2.0
    for t, w in zip(NODES.tolist(), WEIGHTS.tolist()):
        u = 1.0 - t * t
        total = total + w * xp.exp(u * gap_b) * i0e(xp, u * half_ab)
    return lc + xp.log(total)


def bingham_moments(xp, k1, k2):
    """⟨x_1²⟩, ⟨x_2²⟩, ⟨x_3²⟩ of the Bingham density exp(−k1 x_1² − k2 x_2²) (k1 ≥ k2 ≥ 0,
    arrays of one shape), the axes being its own; the three sum to 1."""
    s1 = xp.zeros_like(k1)
    s2 = xp.zeros_like(k1)
    s3 = xp.zeros_like(k1)
    norm = xp.zeros_like(k1)
    half = (k1 - k2) / 2.0
    for t, w in zip(NODES.tolist(), WEIGHTS.tolist()):
        u = 1.0 - t * t
        base = w * xp.exp(-u * k2)
        i0 = i0e(xp, u * half)
        i1 = i1e(xp, u * half)
        norm = norm + base * i0
        s3 = s3 + base * i0 * t * t
        # azimuthal average of cos²φ (axis 1, the concentrated one) and sin²φ under exp(−z cos 2φ)
        s1 = s1 + base * u * (i0 - i1) / 2.0
        s2 = s2 + base * u * (i0 + i1) / 2.0
    return s1 / norm, s2 / norm, s3 / norm
