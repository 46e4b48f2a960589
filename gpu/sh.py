"""Real symmetric spherical harmonics in MRtrix3's convention, and the spheres CSD samples.

MRtrix3 (Tournier et al. 2019; its documentation's "Spherical harmonics" page) stores an
antipodally symmetric function on the sphere as the coefficients of the even orders
l = 0, 2, ..., lmax, volume ``l(l+1)/2 + m`` holding order l, phase m (m = -l..l)::

    Y_lm(θ, φ) = √2 · N_l|m| P_l|m|(cos θ) sin(|m| φ)   m < 0
               =      N_l0  P_l0 (cos θ)               m = 0
               = √2 · N_lm  P_lm (cos θ) cos(m φ)      m > 0

with N_lm = √((2l+1)/(4π) (l-m)!/(l+m)!) and the Condon-Shortley phase (-1)^m inside P_lm
(MRtrix's ``Legendre::Plm_sph``). This is DIPY's ``tournier07`` basis with ``legacy=False``.
θ is measured from +z, φ from +x towards +y, in the frame of the directions given (world RAS
for files TractLens writes).

Everything here is written against an array module ``xp`` (NumPy or CuPy), so the same
code evaluates fODFs on the host and on the device.
"""

from __future__ import annotations

import math

import numpy as np

#: 1/√(4π): Y_00, the value of the l=0 harmonic everywhere.
Y00 = 0.5 / math.sqrt(math.pi)


def n_coefficients(lmax: int) -> int:
    """Number of even-order coefficients up to ``lmax``: (lmax+1)(lmax+2)/2 (45 for lmax 8)."""
    _check_lmax(lmax)
    return (lmax + 1) * (lmax + 2) // 2


def lmax_of(n_coefficients: int) -> int:
    """The lmax whose even-order series has ``n_coefficients`` terms (ValueError otherwise)."""
    for lmax in range(0, 31, 2):
        count = (lmax + 1) * (lmax + 2) // 2
        if count == n_coefficients:
            return lmax
        if count > n_coefficients:
            break
    raise ValueError(
        f"{n_coefficients} is not the number of coefficients of an even-order SH series (1, 6, 15, 28, 45, 66, ...)"
    )


def _check_lmax(lmax: int) -> None:
    if lmax < 0 or lmax % 2 or lmax > 30:
        raise ValueError(f"lmax must be even, between 0 and 30, got {lmax}")


def degrees_orders(lmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(l, m) of each coefficient, in MRtrix's order: index ``l(l+1)/2 + m``."""
    ls, ms = [], []
    for degree in range(0, lmax + 1, 2):
        for order in range(-degree, degree + 1):
            ls.append(degree)
            ms.append(order)
    return np.array(ls), np.array(ms)


def index(degree: int, order: int) -> int:
    """Volume of coefficient (l, m) in an MRtrix SH image."""
    return degree * (degree + 1) // 2 + order


def _legendre_sph(xp, lmax: int, m: int, z):
    """MRtrix's ``Plm_sph``: N_lm P_lm(z) (Condon-Shortley phase included) for l = m..lmax.

    Returns a dict {l: array like z}; the recursion is MRtrix's, so values agree to rounding.
    """
    s = 1.0 - z * z
    value = xp.full_like(z, Y00)
    if m:
        helper = 1.0
        for j in range(1, m + 1):  # Plm_sph_helper(1 - z², 2m) = (1-z²)^m · ∏ (2j-1)/(2j)
            helper *= (2 * j - 1) / (2 * j)
        value = value * xp.sqrt((2 * m + 1) * helper * xp.maximum(s, 0.0) ** m)
        if m & 1:
            value = -value
    out = {m: value}
    if lmax == m:
        return out
    f = math.sqrt(2 * m + 3)
    out[m + 1] = z * f * value
    for n in range(m + 2, lmax + 1):
        previous = z * out[n - 1] - out[n - 2] / f
        f = math.sqrt((4 * n * n - 1) / (n * n - m * m))
        out[n] = previous * f
    return out


def sh_basis(xp, directions, lmax: int):
    """The (N, C) matrix of the C = :func:`n_coefficients` harmonics at N unit ``directions`` (N, 3).

    Row k evaluates a coefficient vector at direction k: ``amplitude = basis @ coefficients``.
    Computed in the directions' floating type (float64 for host reference work).
    """
    _check_lmax(lmax)
    d = xp.asarray(directions)
    if d.dtype.kind != "f":
        d = d.astype(xp.float64)
    norm = xp.sqrt((d * d).sum(axis=-1))
    norm = xp.where(norm > 0, norm, 1.0)
    x, y, z = d[..., 0] / norm, d[..., 1] / norm, xp.clip(d[..., 2] / norm, -1.0, 1.0)
    phi = xp.arctan2(y, x)
    columns: list = [None] * n_coefficients(lmax)
    for m in range(0, lmax + 1):
        legendre = _legendre_sph(xp, lmax, m, z)
        if m == 0:
            for degree in range(0, lmax + 1, 2):
                columns[index(degree, 0)] = legendre[degree]
            continue
        c, s = math.sqrt(2.0) * xp.cos(m * phi), math.sqrt(2.0) * xp.sin(m * phi)
        for degree in range(m + (m & 1), lmax + 1, 2):
            columns[index(degree, m)] = legendre[degree] * c
            columns[index(degree, -m)] = legendre[degree] * s
    return xp.stack(columns, axis=-1)


def zonal_basis(cos_angle, lmax: int, xp=np) -> np.ndarray:
    """(N, lmax/2+1) values of the zonal harmonics Y_l0 (l = 0, 2, ..) at cos θ = ``cos_angle``.

    A function symmetric about an axis is ``zonal_basis(cos θ) @ r`` with ``r`` its zonal
    coefficients (one row of an MRtrix response file).
    """
    z = xp.clip(xp.asarray(cos_angle, dtype=xp.float64), -1.0, 1.0)
    legendre = _legendre_sph(xp, lmax, 0, z)
    return xp.stack([legendre[degree] for degree in range(0, lmax + 1, 2)], axis=-1)


def rotational_harmonics(zonal: np.ndarray) -> np.ndarray:
    """Convolution weights R_l = r_l / Y_l0(0) of a response with zonal coefficients ``r_l``.

    Convolving an fODF f_lm with the response gives the signal's coefficients R_l · f_lm
    (the Funk-Hecke theorem; MRtrix ``SH::sconv_mat``, DIPY ``sh_to_rh``).
    """
    zonal = np.asarray(zonal, dtype=np.float64)
    degrees = np.arange(0, 2 * zonal.shape[-1], 2)
    return zonal / np.sqrt((2 * degrees + 1) / (4 * np.pi))


def expand_per_coefficient(per_degree: np.ndarray, lmax: int) -> np.ndarray:
    """Repeat a per-degree array (.., lmax/2+1) to one value per coefficient (.., C).

    Degrees beyond the array's length are zero (a response of lower order than the fODF)."""
    per_degree = np.asarray(per_degree, dtype=np.float64)
    degrees, _ = degrees_orders(lmax)
    padded = np.zeros((*per_degree.shape[:-1], lmax // 2 + 1))
    k = min(per_degree.shape[-1], padded.shape[-1])
    padded[..., :k] = per_degree[..., :k]
    return padded[..., degrees // 2]


def fibonacci_hemisphere(n: int) -> np.ndarray:
    """``n`` near-uniform unit directions on the upper hemisphere (z > 0), float64 (n, 3).

    A Fibonacci lattice: enough for antipodally symmetric functions, deterministic, and
    any count (MRtrix's CSD constrains the fODF on 300 such directions)."""
    if n < 1:
        raise ValueError("a sphere needs at least one direction")
    k = np.arange(n, dtype=np.float64)
    z = 1.0 - (k + 0.5) / n  # uniform in z over (0, 1]: uniform area on the hemisphere
    golden = math.pi * (3.0 - math.sqrt(5.0))
    phi = golden * k
    r = np.sqrt(np.maximum(0.0, 1.0 - z * z))
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def neighbours(directions: np.ndarray, count: int) -> np.ndarray:
    """(n, count) indices of each direction's nearest others, antipodes counted as the same."""
    d = np.asarray(directions, dtype=np.float64)
    similarity = np.abs(d @ d.T)
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=1)[:, :count]


def rotation_matrix(rotation: np.ndarray, lmax: int) -> np.ndarray:
    """(C, C) matrix taking coefficients in one frame to another: ``c_new = M @ c_old``.

    ``rotation`` (3, 3) maps old-frame directions to new-frame ones (an orthogonal matrix;
    a reflection is allowed). Even-order series are closed under it, so sampling on enough
    directions and refitting is exact (to rounding)."""
    rotation = np.asarray(rotation, dtype=np.float64)
    c = n_coefficients(lmax)
    samples = fibonacci_hemisphere(max(4 * c, 200))
    old = sh_basis(np, samples, lmax)
    new = sh_basis(np, samples @ rotation.T, lmax)
    return np.linalg.lstsq(new, old, rcond=None)[0]
