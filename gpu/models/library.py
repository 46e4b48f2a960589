"""The models shipped with the toolbox, each declared in a few lines (:mod:`.declare`).

* NODDI-Watson (Zhang et al. 2012, NeuroImage 61:1000): S/S0 = (1 − v_iso)[v_ic E_ic +
  (1 − v_ic) E_ec] + v_iso E_iso with E_ic a Watson-dispersed stick (d∥), E_ec the Watson-averaged
  zeppelin with the tortuosity d⊥ = d∥ (1 − v_ic), E_iso a ball (d_iso); d∥ = 1.7e-3 and
  d_iso = 3e-3 mm²/s fixed. The dispersion is fitted as ODI = 2/π arctan(1/κ).
  Maps: NDI = v_ic, ODI, FWF = v_iso.
* NODDI-Bingham (Tariq et al. 2016, NeuroImage 133:207): the same compartments dispersed by a
  Bingham distribution with concentrations κ1 ≥ κ2 across the axes v1, v2 ⟂ v (v2 rotated by ψ
  from e_θ). Fitted as ODI_primary = 2/π arctan(1/κ2) (the dispersed axis) and the ratio
  r = ODI_secondary / ODI_primary ∈ (0.05, 1). Maps: NDI, ODI = 2/π arctan(1/√(κ1 κ2)),
  ODI_primary, ODI_secondary = 2/π arctan(1/κ1), DAI = 2/π arctan((κ1 − κ2)/κ2), FWF.
* Ball & sticks (Behrens et al. 2007), the model of :mod:`tractlens.gpu.ballstick` declared
  through the toolbox (same parameters, order, priors and MCMC energy), to check the toolbox
  against the dedicated kernel as cuDIMOT was checked against bedpostX.
"""

from __future__ import annotations

import numpy as np

from . import compartments as c
from .declare import Model, Parameter

#: b-values (s/mm²) the NODDI models accept: below ~200 perfusion adds signal the model lacks,
#: above 10000 the Gaussian-compartment assumptions (and usually the units) are wrong.
NODDI_B_RANGE = (200.0, 10000.0)


def kappa_from_odi(xp, odi):
    return 1.0 / xp.tan(np.pi / 2.0 * odi)


def odi_from_kappa(xp, kappa):
    return 2.0 / np.pi * xp.arctan(1.0 / kappa)


def _orientation():
    return (Parameter("theta", prior="sphere", orientation=True), Parameter("phi", orientation=True))


def noddi_watson(d_par: float = 1.7e-3, d_iso: float = 3.0e-3) -> Model:
    """NODDI-Watson with fixed diffusivities (mm²/s)."""

    def signal(p, acq, xp):
        kappa = kappa_from_odi(xp, p["odi"])
        intra = c.watson_stick(xp, acq, d_par, kappa, p["theta"], p["phi"])
        extra = c.watson_zeppelin(xp, acq, d_par, d_par * (1.0 - p["v_ic"]), kappa, p["theta"], p["phi"])
        tissue = p["v_ic"] * intra + (1.0 - p["v_ic"]) * extra
        return (1.0 - p["v_iso"]) * tissue + p["v_iso"] * c.ball(xp, acq, d_iso)

    def derived(v, xp):
        return {"NDI": v["v_ic"], "ODI": v["odi"], "FWF": v["v_iso"], "kappa": kappa_from_odi(xp, v["odi"])}

    return Model(
        "noddi-watson",
        (
            # a coarse grid is enough: LM ends at the same optimum from 3 or 80 starting points
            # on the synthetic tests, and the grid costs one model evaluation per combination
            Parameter("v_ic", 0.0, 1.0, (0.3, 0.6)),
            Parameter("odi", 0.01, 0.99, (0.08, 0.25, 0.5)),
            Parameter("v_iso", 0.0, 1.0, (0.05, 0.3)),
            *_orientation(),
        ),
        signal,
        orientations=(("theta", "phi"),),
        derived=derived,
        b_range=NODDI_B_RANGE,
        min_shells=2,
        description=f"NODDI-Watson, d_par {d_par:g}, d_iso {d_iso:g} mm²/s",
        extra={"d_par": d_par, "d_iso": d_iso, "map_names": {"v_ic": "NDI", "odi": "ODI", "v_iso": "FWF"}},
        compiled="noddi-watson",  # its signal line for line in gpu/models/watson_loops.py
    )


def noddi_bingham(d_par: float = 1.7e-3, d_iso: float = 3.0e-3) -> Model:
    """NODDI-Bingham with fixed diffusivities (mm²/s)."""

    def kappas(p, xp):
        return kappa_from_odi(xp, p["odi_p"] * p["ratio"]), kappa_from_odi(xp, p["odi_p"])

    def signal(p, acq, xp):
        k1, k2 = kappas(p, xp)
        angles = (p["theta"], p["phi"], p["psi"])
        intra = c.bingham_stick(xp, acq, d_par, k1, k2, *angles)
        extra = c.bingham_zeppelin(xp, acq, d_par, d_par * (1.0 - p["v_ic"]), k1, k2, *angles)
        tissue = p["v_ic"] * intra + (1.0 - p["v_ic"]) * extra
        return (1.0 - p["v_iso"]) * tissue + p["v_iso"] * c.ball(xp, acq, d_iso)

    def derived(v, xp):
        k1, k2 = kappas(v, xp)
        return {
            "NDI": v["v_ic"],
            "ODI": 2.0 / np.pi * xp.arctan(1.0 / xp.sqrt(k1 * k2)),
            "ODI_primary": v["odi_p"],
            "ODI_secondary": odi_from_kappa(xp, k1),
            "DAI": 2.0 / np.pi * xp.arctan((k1 - k2) / k2),
            "FWF": v["v_iso"],
            "kappa1": k1,
            "kappa2": k2,
        }

    return Model(
        "noddi-bingham",
        (
            # the grid only turns ψ (measured: 4 starts in ψ alone recover DAI better than
            # 48 over all parameters, at a tenth of the grid's cost)
            Parameter("v_ic", 0.0, 1.0, (0.5,)),
            Parameter("odi_p", 0.02, 0.98, (0.25,)),
            Parameter("ratio", 0.05, 1.0, (0.6,)),
            Parameter("v_iso", 0.0, 1.0, (0.1,)),
            *_orientation(),
            Parameter("psi", init_grid=(0.0, np.pi / 4, np.pi / 2, 3 * np.pi / 4)),
        ),
        signal,
        orientations=(("theta", "phi"),),
        derived=derived,
        b_range=NODDI_B_RANGE,
        min_shells=2,
        description=f"NODDI-Bingham, d_par {d_par:g}, d_iso {d_iso:g} mm²/s",
        extra={
            "d_par": d_par,
            "d_iso": d_iso,
            "map_names": {"v_ic": "NDI", "odi_p": "ODI_primary", "v_iso": "FWF", "ratio": "ODI_ratio"},
        },
    )


def ball_sticks(n_sticks: int = 1, ard_weight: float = 1.0) -> Model:
    """Ball & ``n_sticks`` sticks; ARD prior ``ard_weight · log f`` on the fractions of sticks 2..n."""
    if not 1 <= n_sticks <= 3:
        raise ValueError(f"n_sticks must be 1, 2 or 3, got {n_sticks}")

    def ard(xp, f):
        return ard_weight * xp.log(xp.maximum(f, 1e-30))

    sticks = []
    for i in range(1, n_sticks + 1):
        sticks += [
            Parameter(f"theta{i}", prior="sphere", orientation=True),
            Parameter(f"phi{i}", orientation=True),
            Parameter(
                f"f{i}", 0.0, 1.0, (0.3, 0.6) if i == 1 else (0.05,), prior=ard if i > 1 and ard_weight else "uniform"
            ),
        ]

    def signal(p, acq, xp):
        fractions = [p[f"f{i}"] for i in range(1, n_sticks + 1)]
        out = (1.0 - sum(fractions)) * c.ball(xp, acq, p["d"])
        for i, f in enumerate(fractions, start=1):
            out = out + f * c.stick(xp, acq, p["d"], p[f"theta{i}"], p[f"phi{i}"])
        return out

    return Model(
        "ball-sticks",
        (Parameter("d", 0.0, np.inf, (0.7e-3, 1.5e-3)), *sticks),
        signal,
        orientations=tuple((f"theta{i}", f"phi{i}") for i in range(1, n_sticks + 1)),
        description=f"ball & {n_sticks} stick(s)",
    )


#: Models by command-line name: ``factory(d_par, d_iso)``.
MODELS = {
    "noddi-watson": lambda d_par, d_iso: noddi_watson(d_par, d_iso),
    "noddi-bingham": lambda d_par, d_iso: noddi_bingham(d_par, d_iso),
    "ball-sticks": lambda d_par, d_iso: ball_sticks(2),
}
