"""How a microstructure model is declared: its parameters and its signal, cuDIMOT style.

A model (Hernández-Fernández et al. 2019, cuDIMOT; source document 003, ch. 5) is a list of
:class:`Parameter` (name, bounds, the values the grid search tries, a prior for MCMC) and a
signal function ``signal(params, acq, xp)`` written once with array operations of ``xp``
(NumPy or CuPy): ``params`` maps each name to an (N, 1) column of N voxels, ``acq`` is the
:class:`Acquisition`, and it returns the attenuation E (N, M) (1 at b = 0). The fitting engine
(:mod:`.fit`) adds the b = 0 signal S0 itself and fits S = S0 · E. Example, a ball and a stick::

    from tractlens.gpu.models import Model, Parameter, compartments as c

    def signal(p, acq, xp):
        return (1 - p["f"]) * c.ball(xp, acq, p["d"]) + p["f"] * c.stick(xp, acq, p["d"], p["theta"], p["phi"])

    model = Model(
        "ball-stick",
        (Parameter("d", 1e-5, 5e-3, (1e-3,)), Parameter("f", 0.0, 1.0, (0.2, 0.5, 0.8)),
         Parameter("theta", orientation=True), Parameter("phi", orientation=True)),
        signal,
        orientations=(("theta", "phi"),),
    )

Bounded parameters are fitted through a transform that keeps them inside their bounds
(:func:`to_internal`/:func:`from_internal`): a logistic for two finite bounds, an
exponential for one, none for none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Priors a :class:`Parameter` may name (MCMC energies, i.e. minus log densities up to a constant).
PRIORS = ("uniform", "sphere")


@dataclass(frozen=True)
class Parameter:
    """One model parameter.

    name : key in the signal function's ``params``.
    lower, upper : bounds (±inf for none); the fit never leaves them.
    init_grid : values the grid search tries (their Cartesian product over the parameters);
        empty: the midpoint of finite bounds, else the bound + 1, else 0.
    prior : ``"uniform"`` (flat inside the bounds), ``"sphere"`` (for a polar angle θ:
        uniform orientations on the sphere, energy −log|sin θ|), or a callable
        ``prior(xp, value) -> energy`` (N, 1) (e.g. an ARD prior ``lambda xp, f: xp.log(f)``).
    orientation : an angle of an orientation; set from the tensor fit, not by the grid.
    """

    name: str
    lower: float = -np.inf
    upper: float = np.inf
    init_grid: tuple[float, ...] = ()
    prior: str | Callable[[Any, Any], Any] = "uniform"
    orientation: bool = False

    def __post_init__(self):
        if not self.lower < self.upper:
            raise ValueError(f"parameter {self.name}: lower bound {self.lower} is not below upper {self.upper}")
        if isinstance(self.prior, str) and self.prior not in PRIORS:
            raise ValueError(f"parameter {self.name}: unknown prior {self.prior!r} (one of {', '.join(PRIORS)})")
        outside = [v for v in self.init_grid if not self.lower < v < self.upper]
        if outside:
            raise ValueError(f"parameter {self.name}: grid values {outside} are not inside the bounds")

    def default_start(self) -> float:
        if self.init_grid:
            return float(self.init_grid[0])
        if np.isfinite(self.lower) and np.isfinite(self.upper):
            return (self.lower + self.upper) / 2.0
        if np.isfinite(self.lower):
            return self.lower + 1.0
        if np.isfinite(self.upper):
            return self.upper - 1.0
        return 0.0


@dataclass(frozen=True)
class Model:
    """A microstructure model: parameters, signal, and how to present the result.

    orientations : pairs (θ name, φ name) of the model's orientations, in the gradient frame;
        the grid search starts the i-th from the tensor fit's i-th eigenvector.
    derived : ``derived(values, xp) -> {map name: (N,) array}`` from the fitted values
        ((N,) arrays by name), e.g. ODI from κ; the pipeline writes these maps too.
    b_range : the b-values (s/mm², diffusion-weighted ones) the model is meant for.
    min_shells : distinct non-zero b-values the model needs (NODDI: 2).
    compiled : the name of compiled CPU loops of this model's fit (:mod:`.host_fit`), run
        instead of the array program on the CPU when numba is installed; empty for none. The
        loops compute their own signal: name them only for that very signal.
    """

    name: str
    parameters: tuple[Parameter, ...]
    signal: Callable[[dict, Any, Any], Any]
    orientations: tuple[tuple[str, str], ...] = ()
    derived: Callable[[dict, Any], dict] | None = None
    b_range: tuple[float, float] = (0.0, np.inf)
    min_shells: int = 1
    description: str = ""
    extra: dict = field(default_factory=dict)
    compiled: str = ""

    def __post_init__(self):
        names = [p.name for p in self.parameters]
        if len(set(names)) != len(names) or "s0" in names:
            raise ValueError(f"model {self.name}: parameter names must be unique and not 's0'")
        for pair in self.orientations:
            for name in pair:
                if name not in names:
                    raise ValueError(f"model {self.name}: orientation angle {name!r} is not a parameter")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)


#: The engine's own parameter: the b = 0 signal (in units of the voxel's mean b = 0 signal).
S0 = Parameter("s0", 0.0, np.inf, (1.0,))


@dataclass
class Acquisition:
    """b-values (M,) in s/mm² and unit gradient directions (M, 3), on the array module of the fit."""

    bvals: np.ndarray
    bvecs: np.ndarray
    xp: Any = np

    def __post_init__(self):
        self.bvals_xp = self.xp.asarray(np.asarray(self.bvals, dtype=np.float64))
        self.bvecs_xp = self.xp.asarray(np.asarray(self.bvecs, dtype=np.float64))

    @property
    def count(self) -> int:
        return len(self.bvals)


def shells(bvals: np.ndarray, b0_threshold: float, rounding: float = 100.0) -> np.ndarray:
    """The distinct non-zero b-values (rounded to ``rounding`` s/mm², the usual scanner jitter)."""
    b = np.asarray(bvals, dtype=np.float64)
    return np.unique(np.round(b[b > b0_threshold] / rounding) * rounding)


# --------------------------------------------------------------------------------------
# Transforms: internal z (unbounded) <-> parameter value.


def from_internal(xp, parameter: Parameter, z):
    lo, hi = parameter.lower, parameter.upper
    if np.isfinite(lo) and np.isfinite(hi):
        return lo + (hi - lo) / (1.0 + xp.exp(-xp.clip(z, -700.0, 700.0)))
    if np.isfinite(lo):
        return lo + xp.exp(xp.minimum(z, 700.0))
    if np.isfinite(hi):
        return hi - xp.exp(xp.minimum(z, 700.0))
    return z


def to_internal(xp, parameter: Parameter, value):
    lo, hi = parameter.lower, parameter.upper
    if np.isfinite(lo) and np.isfinite(hi):
        u = xp.clip((value - lo) / (hi - lo), 1e-9, 1.0 - 1e-9)
        return xp.log(u / (1.0 - u))
    if np.isfinite(lo):
        return xp.log(xp.maximum(value - lo, 1e-300))
    if np.isfinite(hi):
        return xp.log(xp.maximum(hi - value, 1e-300))
    return value * 1.0


def all_parameters(model: Model) -> tuple[Parameter, ...]:
    """S0 first, then the model's."""
    return (S0, *model.parameters)


def as_columns(parameters: Sequence[Parameter], values) -> dict:
    """{name: (N, 1) column} of a (N, P) value array."""
    return {p.name: values[:, i : i + 1] for i, p in enumerate(parameters)}
