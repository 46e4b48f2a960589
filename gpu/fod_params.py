"""Parameters of tracking on fibre orientation distributions (:mod:`gpu.fod_tracking`).

Deterministic fODF tracking follows the fODF peak nearest the incoming direction (MRtrix3's
``SD_STREAM``); probabilistic fODF tracking draws each step's direction within a cone,
with probability proportional to the fODF amplitude to a power (MRtrix3's ``iFOD1``). The
fields shared with tensor tracking (step, lengths, max angle) repeat its definitions
(:func:`gpu.params.same_as`), so a default exists once and fODF tracking keeps the options
of tensor tracking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .deterministic import DeterministicParams
from .params import meta, same_as

#: MRtrix3's default fODF amplitude cut-off (``tckgen -cutoff``).
DEFAULT_CUTOFF = 0.1


def _cutoff_field():
    return field(
        default=DEFAULT_CUTOFF,
        metadata=meta(
            "fODF cut-off",
            "stop where the fODF amplitude along the way falls below this",
            "",
            (0.0, 100.0),
        ),
    )


@dataclass(frozen=True)
class FodDeterministicParams:
    """Deterministic fODF tracking (SD_STREAM): lengths in millimetres, angles in degrees."""

    # tensor tracking's own fields (one definition, one option for both trackers)
    step_mm: float = same_as(DeterministicParams, "step_mm")
    cutoff: float = _cutoff_field()
    max_angle_deg: float = same_as(DeterministicParams, "max_angle_deg")
    min_length_mm: float = same_as(DeterministicParams, "min_length_mm")
    max_length_mm: float = same_as(DeterministicParams, "max_length_mm")
    keep_truncated: bool = same_as(DeterministicParams, "keep_truncated")

    def __post_init__(self) -> None:
        _check_common(self)

    @property
    def max_steps(self) -> int:
        """Steps of the whole streamline (both halves together)."""
        return math.floor(self.max_length_mm / self.step_mm + 1e-9)


@dataclass(frozen=True)
class FodProbabilisticParams:
    """Probabilistic fODF tracking (iFOD1): each step's direction is drawn in the cone of
    ``max_angle_deg`` about the incoming one with probability ∝ amplitude^``power``,
    by rejection sampling (at most ``max_trials`` draws per step)."""

    step_mm: float = same_as(DeterministicParams, "step_mm")
    cutoff: float = _cutoff_field()
    max_angle_deg: float = same_as(DeterministicParams, "max_angle_deg", default=30.0)
    power: float = field(
        default=1.0,
        metadata=meta(
            "Power",
            "directions are drawn with probability ∝ amplitude^power (higher: closer to the peaks)",
            "",
            (0.1, 20.0),
        ),
    )
    max_trials: int = field(
        default=50,
        metadata=meta(
            "Max trials",
            "draws per step before the streamline ends for want of a direction above the cut-off",
            "",
            (1, 10000),
        ),
    )
    min_length_mm: float = same_as(DeterministicParams, "min_length_mm")
    max_length_mm: float = same_as(DeterministicParams, "max_length_mm")
    keep_truncated: bool = same_as(DeterministicParams, "keep_truncated")

    def __post_init__(self) -> None:
        _check_common(self)
        if not (self.power > 0 and math.isfinite(self.power)):
            raise ValueError(f"power must be positive, got {self.power}")
        if not 1 <= self.max_trials <= 10000:
            raise ValueError(f"max trials must be in [1, 10000], got {self.max_trials}")

    @property
    def max_steps(self) -> int:
        return math.floor(self.max_length_mm / self.step_mm + 1e-9)


def _check_common(p) -> None:
    checks = [
        (p.step_mm > 0 and math.isfinite(p.step_mm), f"step must be positive, got {p.step_mm}"),
        (p.cutoff >= 0 and math.isfinite(p.cutoff), f"the fODF cut-off must be ≥ 0, got {p.cutoff}"),
        (0 < p.max_angle_deg <= 180, f"max angle must be in (0, 180] degrees, got {p.max_angle_deg}"),
        (p.min_length_mm >= 0, f"min length must be ≥ 0, got {p.min_length_mm}"),
        (
            p.max_length_mm >= p.step_mm,
            f"max length ({p.max_length_mm} mm) must be at least one step ({p.step_mm} mm)",
        ),
        (
            p.min_length_mm <= p.max_length_mm,
            f"min length ({p.min_length_mm}) exceeds max length ({p.max_length_mm})",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
