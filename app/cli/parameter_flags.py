"""How the parameter dataclasses appear on the ``tractlens`` command line.

The dataclasses (``gpu`` engine parameters and ``app.params``) define each parameter once with
its physical metadata: label, documentation, unit, range, choices and default. What only the
command line needs is here, per class and field: the flags (the primary one first, then
aliases; a field not listed gets ``--field-name``), the help where the command line must say
more than the field's documentation, the placeholder, whether a flag negates a True default,
``nargs`` for tuples, and how ``--help`` names a default of None. A field mapped to ``None``
has no option. :mod:`app.cli.options` builds the options from both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tractlens.gpu.ballstick import BallStickParams
from tractlens.gpu.commit import CommitParams
from tractlens.gpu.connectivity import EndpointParams
from tractlens.gpu.csd import CSDParams
from tractlens.gpu.csd_peaks import PeakParams
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.dti import DTIFitParams
from tractlens.gpu.fod_params import FodDeterministicParams, FodProbabilisticParams
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.models import ModelFitParams
from tractlens.gpu.probabilistic_params import ProbParams
from tractlens.gpu.tractometry import ProfileParams

from ..params import (
    ConnectomeParams,
    DicomExportParams,
    DicomImportParams,
    EnvelopeParams,
    GeodesicSeedingParams,
    LesionDistanceParams,
    ProbOutputParams,
    ProfileTableParams,
    RegisterParams,
    ReportParams,
    SeedingParams,
    StatisticsParams,
    TractogramOutputParams,
)


@dataclass(frozen=True)
class Option:
    """The command line's side of one parameter (see the module's documentation)."""

    flags: tuple[str, ...] = ()
    help: str | None = None
    metavar: str | None = None
    negated: bool = False
    nargs: str | None = None
    default_text: str | None = None


#: Per parameter class, the fields whose option is not the default one (``--field-name``, the
#: field's documentation as help), or that have none (``None``).
OPTIONS: dict[type, dict[str, Option | None]] = {
    DTIFitParams: {
        "min_signal": None,
        "precision": Option(default_text="auto: float32 on GPU, float64 on CPU"),
        "engine": None,
    },
    CSDParams: {
        "regularisation": Option(flags=("--lambda",)),
        "threshold": Option(flags=("--tau",)),
        "max_iterations": None,
        "msmt_max_iterations": None,
        "constraint_directions": None,
        "fa_threshold": Option(flags=("--response-fa",)),
        "gm_fa": None,
        "gm_md": None,
        "csf_fa": None,
        "csf_md": None,
    },
    PeakParams: {
        "relative_threshold": Option(flags=("--peak-threshold",)),
        "min_separation_deg": Option(flags=("--peak-separation",)),
    },
    BallStickParams: {
        "n_fibres": Option(flags=("--nfibres",)),
        "burnin": Option(flags=("--burnin",)),
        "sample_every": Option(flags=("--sampleevery",)),
        "model": Option(flags=("--model",)),
        "rician": Option(help="Rician noise model (default Gaussian)"),
        "update_every": None,
        "lm_iterations": None,
        "seed": Option(flags=("--seed-rng",), metavar="N"),
    },
    ModelFitParams: {
        "update_every": None,
        "seed": Option(flags=("--seed-rng",), metavar="N"),
    },
    DeterministicParams: {
        "step_mm": Option(flags=("--step", "--step-mm"), help="step length in mm (as track geodesic's --step)"),
        "max_angle_deg": Option(flags=("--max-angle",), help="max turn per step in degrees"),
        "min_length_mm": Option(flags=("--min-length",)),
        "max_length_mm": Option(flags=("--max-length",)),
        "method": Option(flags=("--method",)),
        "tensorline_puncture": Option(flags=("--puncture",)),
        "keep_truncated": Option(
            flags=("--discard-truncated",),
            help="drop streamlines that reached --max-length instead of keeping them",
            negated=True,
        ),
    },
    FodDeterministicParams: {
        "step_mm": None,
        "cutoff": Option(
            flags=("--cutoff",),
            help="fODF amplitude cut-off: streamlines end where the fODF falls below it (MRtrix's -cutoff)",
        ),
        "max_angle_deg": None,
        "min_length_mm": None,
        "max_length_mm": None,
        "keep_truncated": None,
    },
    FodProbabilisticParams: {
        "step_mm": Option(flags=("--step", "--step-mm"), help="step length in mm (as track geodesic's --step)"),
        "cutoff": Option(
            flags=("--cutoff",),
            help="fODF amplitude cut-off: streamlines end where the fODF falls below it (MRtrix's -cutoff)",
        ),
        "max_angle_deg": Option(flags=("--max-angle",), help="max turn per step in degrees"),
        "power": Option(flags=("--power",)),
        "max_trials": Option(flags=("--max-trials",)),
        "min_length_mm": Option(flags=("--min-length",)),
        "max_length_mm": Option(flags=("--max-length",)),
        "keep_truncated": Option(
            flags=("--discard-truncated",),
            help="drop streamlines that reached --max-length instead of keeping them",
            negated=True,
        ),
    },
    SeedingParams: {
        "seeds_per_voxel": Option(metavar="K"),
        "placement": Option(
            flags=("--seed-placement",), help="random within the voxel, or an m×m×m grid (K must be a cube)"
        ),
        "rng_seed": Option(flags=("--seed-rng",), help="random seed for seed placement", metavar="N"),
    },
    GeodesicParams: {
        "step": Option(
            flags=("--step-vox",),
            help="step in voxels of the smallest voxel size (--step gives it in mm)",
        ),
        "max_steps": Option(metavar="N"),
        "max_length_mm": Option(flags=("--max-length",), metavar="MM"),
        "max_angle_deg": Option(flags=("--max-angle",), metavar="DEG"),
        "fa_threshold": Option(metavar="T"),
        "normalize": Option(flags=("--no-normalize",), help="do not rescale the velocity to unit length", negated=True),
        "store_every": Option(flags=("--keep-every",), metavar="N"),
        "stop_at_target": None,
        "mask_tolerance_mm": Option(flags=("--mask-tolerance",), metavar="MM"),
    },
    MetricParams: {
        "metric": Option(help="auto (best measured per method), inverse, adjugate, or adaptive"),
        "gain": Option(help="tensor scale before inversion (0 = 1/mean MD)"),
        "sharpen_power": Option(metavar="P"),
        "sharpen_fa": Option(metavar="T"),
        "conformal_power": Option(metavar="K"),
    },
    GeodesicSeedingParams: {
        "seeds_per_voxel": Option(metavar="K"),
        "placement": Option(flags=("--seed-placement",), help="within each voxel"),
        "rng_seed": Option(flags=("--seed-rng",), help="random seed for seed placement", metavar="N"),
        "directions": Option(help="fibres per seed point (0 = sized for the engine)", metavar="N"),
        "cone_deg": Option(
            flags=("--cone",),
            help="directions within this half-angle around ±e1",
            metavar="DEG",
            default_text="whole sphere",
        ),
        "top_percent": Option(help="keep the P % best by CM", metavar="P"),
        "two_point": Option(flags=("--two-point",)),
        "target_points": Option(metavar="N"),
        "method": Option(help="rays, eikonal (minimal geodesic of every seed point to the target), or auto"),
        "neighbourhood": Option(metavar="R"),
    },
    ProbParams: {
        "n_samples": Option(flags=("--nsamples",)),
        "step_mm": Option(flags=("--steplength",)),
        "n_steps": Option(flags=("--nsteps",)),
        "cthr": Option(help="curvature threshold, a cosine"),
        "randfib": Option(help="first step's stick"),
        "modeuler": Option(help="modified Euler integration"),
        "waycond": Option(help="pass all waypoints or any"),
        "seed": Option(flags=("--seed-rng",), metavar="N"),
    },
    ProbOutputParams: {
        "seed_matrix": Option(flags=("--seed-matrix", "--omatrix1")),
        "save_paths_max": Option(metavar="N"),
        "matrix_format": Option(help="connectome matrix files"),
    },
    TractogramOutputParams: {
        "positions_dtype": Option(flags=("--dtype",)),
    },
    CommitParams: {
        "d_par": None,
        "d_perp": None,
        "d_iso": None,
        "lambda_": Option(flags=("--lambda",)),
        "min_segment_mm": None,
        "radii_um": Option(
            flags=("--radii",),
            help="cylinder-zeppelin-ball: axon radii in µm, one response each",
            metavar="UM",
            nargs="+",
        ),
        "small_delta_ms": Option(
            flags=("--small-delta",), help="cylinder-zeppelin-ball: pulse duration δ", metavar="MS"
        ),
        "big_delta_ms": Option(flags=("--big-delta",), help="cylinder-zeppelin-ball: pulse separation Δ", metavar="MS"),
    },
    ConnectomeParams: {
        "weight": Option(help="cell value: count, mean length in mm, mean cm, mean commit weight"),
        "radius_mm": Option(flags=("--radius",), help="endpoint search radius in mm", metavar="MM"),
    },
    EndpointParams: {
        "radius_mm": Option(flags=("--radius",), help="endpoint search radius in mm", metavar="MM"),
    },
    ProfileParams: {
        "n_points": Option(flags=("--points",), help="points along the bundle"),
    },
    LesionDistanceParams: {
        "margin_mm": Option(flags=("--margin",), help="safety margin in mm", metavar="MM"),
    },
    ReportParams: {
        "margin_mm": Option(
            flags=("--margin",), help="safety margin in mm", metavar="MM", default_text="the session's"
        ),
        "size": Option(metavar="SIZE"),
        "png": Option(flags=("--no-png",), help="no PNG pages beside the PDF", negated=True),
    },
    StatisticsParams: {
        "sampling": Option(flags=("--sampling",)),
    },
    DicomExportParams: {
        "formats": Option(flags=("--as",), metavar="LIST"),
        "dilate_mm": Option(flags=("--dilate",), metavar="MM"),
        "deidentify": Option(flags=("--deidentify",)),
    },
    EnvelopeParams: {"levels": Option(metavar="LIST")},
    RegisterParams: {
        "spacing_mm": Option(flags=("--spacing",), metavar="MM"),
        "sampling": Option(metavar="FRACTION"),
        "bins": Option(metavar="N"),
        "affine_iterations": Option(nargs="+", metavar="N"),
        "syn_iterations": Option(nargs="+", metavar="N"),
        "syn_radius": Option(metavar="N"),
        "rng_seed": Option(flags=("--seed-rng",), metavar="N"),
    },
    ProfileTableParams: {
        "subject": Option(metavar="LABEL", default_text="the sub-XX in the paths, else empty"),
        "session": Option(metavar="LABEL", default_text="the ses-YY in the paths, else empty"),
    },
    DicomImportParams: {
        "subject": Option(flags=("--subject",), metavar="LABEL"),
        "deidentify": Option(flags=("--deidentify",)),
    },
}


DEFAULT = Option()


def option_of(params_type: type, name: str) -> Option | None:
    """The command-line option of field ``name`` of ``params_type``; None when it has none."""
    return OPTIONS.get(params_type, {}).get(name, DEFAULT)


def cli_flags(params_type: type, name: str) -> tuple[str, ...]:
    """The command-line flags of a field: its own, else ``--field-name``; () when it has none."""
    option = option_of(params_type, name)
    if option is None:
        return ()
    return option.flags or ("--" + name.replace("_", "-"),)


def check_table() -> None:
    """Every entry names a field of its class (a renamed field must not keep a stale option)."""
    for params_type, options in OPTIONS.items():
        names = {spec.name for spec in dataclasses.fields(params_type)}
        unknown = set(options) - names
        if unknown:
            raise KeyError(f"{params_type.__name__} has no field {', '.join(sorted(unknown))}")
