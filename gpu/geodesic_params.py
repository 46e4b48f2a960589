"""The parameters of geodesic tractography (:mod:`gpu.geodesic`): the metric made from the
tensors (:class:`MetricParams`) and the tracing of the geodesics (:class:`GeodesicParams`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .geodesic_metrics import METRIC_CHOICES
from .params import meta

INTEGRATORS = ("euler", "rk2", "rk4")


CHOICES = {"integrator": INTEGRATORS, "metric": METRIC_CHOICES}


@dataclass(frozen=True)
class MetricParams:
    """How the tensor becomes the metric (pre-processing, seed 004 Algorithm 1; the metrics in
    :mod:`gpu.geodesic_metrics`)."""

    metric: str = field(
        default="auto",
        metadata=meta(
            "Metric",
            "inverse tensor D⁻¹ (seed 004), its adjugate det(D)·D⁻¹ (Fuster et al. 2016), D⁻¹ with the "
            "adaptive conformal factor that makes geodesics follow curved bundles (Hao et al. 2011), or auto: "
            "the one measured best for the method (rays: adaptive; two-point: inverse; eikonal: det(D)²·D⁻¹)",
            choices=METRIC_CHOICES,
        ),
    )
    gain: float = field(
        default=0.0,
        metadata=meta(
            "Gain",
            "tensor scale factor; 0 = 1 / mean diffusivity",
            "",
            (0, 1e9),
        ),
    )
    sharpen_power: int = field(
        default=1,
        metadata=meta(
            "Sharpen power",
            "integer power p of the tensor where FA < the threshold (1 = off)",
            "",
            (1, 10),
        ),
    )
    sharpen_fa: float = field(
        default=0.0,
        metadata=meta("Sharpen below FA", "sharpen the tensors whose FA is below this", "", (0, 1)),
    )

    conformal_power: float = field(
        default=0.0,
        metadata=meta(
            "Conformal power",
            "multiply the metric by (det D / median det)^k more (0 = off)",
            "",
            (0, 4),
        ),
    )

    def __post_init__(self) -> None:
        if self.metric not in METRIC_CHOICES:
            raise ValueError(f"the metric must be one of {', '.join(METRIC_CHOICES)}, got {self.metric!r}")
        if not (0 <= self.conformal_power <= 4 and math.isfinite(self.conformal_power)):
            raise ValueError(f"the conformal power must be in [0, 4], got {self.conformal_power}")
        if not (self.gain >= 0 and math.isfinite(self.gain)):
            raise ValueError(f"gain must be ≥ 0 (0 = automatic), got {self.gain}")
        if int(self.sharpen_power) != self.sharpen_power or self.sharpen_power < 1:
            raise ValueError(f"the sharpening power must be a positive integer, got {self.sharpen_power}")
        if not 0 <= self.sharpen_fa <= 1:
            raise ValueError(f"the sharpening FA threshold must be in [0, 1], got {self.sharpen_fa}")


@dataclass(frozen=True)
class GeodesicParams:
    """Integration and stopping (step in voxels of the smallest voxel size; 0 turns a rule off)."""

    step: float = field(
        default=0.1,
        metadata=meta(
            "Step",
            "step length in voxels",
            "vox",
            (0.005, 2.0),
        ),
    )
    integrator: str = field(
        default="rk2", metadata=meta("Integrator", "Euler, RK2 (midpoint) or RK4", choices=INTEGRATORS)
    )
    max_steps: int = field(default=2000, metadata=meta("Max steps", "steps per fibre", "", (1, 100000)))
    max_length_mm: float = field(
        default=0.0,
        metadata=meta(
            "Max length",
            "stop at this Euclidean length (0 = off)",
            "mm",
            (0, 10000),
        ),
    )
    max_angle_deg: float = field(
        default=0.0,
        metadata=meta(
            "Max angle",
            "stop where a step turns more than this (0 = off)",
            "°",
            (0, 180),
        ),
    )
    fa_threshold: float = field(
        default=0.0,
        metadata=meta("FA threshold", "stop where FA falls below this (0 = off)", "", (0, 0.99)),
    )
    normalize: bool = field(
        default=True,
        metadata=meta(
            "Unit speed",
            "rescale the velocity to unit length after every step",
        ),
    )
    store_every: int = field(
        default=5,
        metadata=meta(
            "Keep every",
            "keep every n-th point (the last one always)",
            "",
            (1, 1000),
        ),
    )
    stop_at_target: bool = field(
        default=True, metadata=meta("Stop at target", "end fibres where they enter the target")
    )
    mask_tolerance_mm: float = field(
        default=4.0,
        metadata=meta(
            "Mask tolerance",
            "a fibre may run this far outside the tracking mask before it ends (0 = it ends at the edge)",
            "mm",
            (0, 100),
        ),
    )

    def __post_init__(self) -> None:
        checks = [
            (self.step > 0 and math.isfinite(self.step), f"step must be positive, got {self.step}"),
            (self.integrator in INTEGRATORS, f"integrator must be one of {', '.join(INTEGRATORS)}"),
            (int(self.max_steps) == self.max_steps and self.max_steps >= 1, "max steps must be a positive integer"),
            (self.max_length_mm >= 0, "max length must be ≥ 0 (0 = off)"),
            (0 <= self.max_angle_deg <= 180, "max angle must be in [0, 180] degrees (0 = off)"),
            (0 <= self.fa_threshold < 1, "FA threshold must be in [0, 1)"),
            (int(self.store_every) == self.store_every and self.store_every >= 1, "keep-every must be ≥ 1"),
            (0 <= self.mask_tolerance_mm < math.inf, "the mask tolerance must be ≥ 0 mm"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def stored_points(self) -> int:
        return int(self.max_steps) // int(self.store_every) + 2
