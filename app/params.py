"""The parameters of the use cases that have no engine dataclass of their own: seeding,
geodesic ranking, connectome, lesion distance, probabilistic outputs, written tractograms and the report.

Each is a frozen dataclass whose field metadata (``gpu.params.meta``) carries the label,
help, unit, limits, choices and command-line flags, like the engine's parameter classes
(``gpu.dti.DTIFitParams``, ``gpu.deterministic.DeterministicParams``, ...). The GUI panels
and the ``tractlens`` options take their defaults and ranges from here, so each is written
once. :data:`PARAMS_TYPES` lists every parameter class, engine ones included; ``field_of``
and ``default_of`` (the metadata readers) are re-exported here for the widgets, which reach
the engine only through ``app``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
from tractlens.gpu.params import default_of as default_of
from tractlens.gpu.params import field_of as field_of
from tractlens.gpu.params import meta, same_as
from tractlens.gpu.probabilistic_params import ProbParams
from tractlens.gpu.tractometry import ProfileParams

from .params_anatomy import BundleParams, RegisterParams

PLACEMENTS = ("random", "grid")

#: What a connectome cell holds (``--weight``).
WEIGHTS = {
    "count": "streamlines joining the two regions",
    "length": "mean length of those streamlines (mm)",
    "cm": "mean connectivity measure (CM) of those streamlines (geodesic tracking)",
    "commit": "mean COMMIT weight of those streamlines",
}


@dataclass(frozen=True)
class SeedingParams:
    """Where deterministic tracking starts: seeds per seed voxel, their placement, the random seed.

    One seed per voxel, as the command line and the pipeline always had (and DIPY's
    ``seeds_from_mask``): scripts keep their results, and a whole-brain run stays at one
    streamline per white-matter voxel (~1 M at HCP size; four would need four times the
    memory). The panel, which offered 4, now starts at 1 too; a small seed ROI is made
    denser by raising it.
    """

    seeds_per_voxel: int = field(
        default=1,
        metadata=meta("Seeds per voxel", "seeds in every seed voxel", "", (1, 1000)),
    )
    placement: str = field(
        default="random",
        metadata=meta(
            "Placement",
            "random within the voxel, or an m×m×m grid (seeds per voxel must be a cube)",
            choices=PLACEMENTS,
        ),
    )
    rng_seed: int = field(
        default=0,
        metadata=meta(
            "Random seed",
            "the same number gives the same seeds, and so the same streamlines",
            "",
            (0, 2**31 - 1),
        ),
    )


GEODESIC_METHODS = ("auto", "rays", "eikonal")


@dataclass(frozen=True)
class GeodesicSeedingParams:
    """Seed points of geodesic ray tracing, the fibres shot from each, and the share kept by CM."""

    seeds_per_voxel: int = same_as(SeedingParams, "seeds_per_voxel", default=1, help="seed points in every seed voxel")
    placement: str = same_as(SeedingParams, "placement")
    rng_seed: int = same_as(SeedingParams, "rng_seed", help="the same number gives the same seed points")
    directions: int = field(
        default=0,
        metadata=meta(
            "Directions per point",
            "fibres shot from every seed point (0 = sized for the engine: about 260 000 fibres per seed "
            "region on a GPU, 4 000 on the CPU)",
            "",
            (0, 100000),
        ),
    )
    cone_deg: float | None = field(
        default=None,
        metadata=meta(
            "Cone",
            "half-angle of the cone of initial directions around ±e1 (otherwise the whole sphere)",
            "°",
            (1.0, 90.0),
        ),
    )
    top_percent: float = field(
        default=100.0,
        metadata=meta(
            "Top",
            "keep the fibres with the highest connectivity measure",
            "%",
            (1.0, 100.0),
        ),
    )

    two_point: bool = field(
        default=False,
        metadata=meta(
            "Two-point",
            "join every seed point to points of the target by refining the initial direction until the "
            "geodesic hits them (shooting; seed 004 §3.4.2): a CM for every seed–target pair",
        ),
    )
    target_points: int = field(
        default=16,
        metadata=meta(
            "Target points",
            "points of the target region each seed point is joined to (two-point ray tracing)",
            "",
            (1, 1000),
        ),
    )

    method: str = field(
        default="auto",
        metadata=meta(
            "Method",
            "how seed points are joined to the target: rays (shoot fibres, keep those that reach it), eikonal "
            "(the minimal geodesic from every seed point, from the metric's distance map to the target), or auto "
            "(eikonal with a target, rays without)",
            choices=GEODESIC_METHODS,
        ),
    )

    neighbourhood: int = field(
        default=1,
        metadata=meta(
            "Neighbourhood",
            "eikonal: the graph's steps reach this many voxels (1: 26 neighbours; 2: 98 directions, paths bend "
            "at finer angles, about 4x the work)",
            "vox",
            (1, 2),
        ),
    )

    #: the cone's initial value in the panel, where it is off until ticked
    CONE_DEG_WHEN_ON = 30.0

    def __post_init__(self) -> None:
        if self.target_points < 1:
            raise ValueError(f"--target-points must be at least 1, got {self.target_points}")
        if self.directions < 0:
            raise ValueError(f"--directions must be at least 0 (0: sized for the engine), got {self.directions}")


@dataclass(frozen=True)
class ConnectomeParams:
    """What a connectome cell holds and how far a streamline end looks for its region."""

    weight: str = field(
        default="count",
        metadata=meta(
            "Weight",
            "the value of a cell: " + "; ".join(f"{k}: {v}" for k, v in WEIGHTS.items()),
            choices=tuple(WEIGHTS),
        ),
    )
    radius_mm: float = same_as(EndpointParams, "radius_mm")


@dataclass(frozen=True)
class LesionDistanceParams:
    """The presurgical safety margin: streamlines closer than this to the lesion are counted."""

    margin_mm: float = field(
        default=5.0,
        metadata=meta(
            "Safety margin",
            "streamlines closer than this to the lesion are counted",
            "mm",
            (0.1, 100.0),
        ),
    )

    def __post_init__(self) -> None:
        if not (self.margin_mm > 0 and math.isfinite(self.margin_mm)):
            raise ValueError(f"--margin must be a positive distance in mm, got {self.margin_mm:g}")


@dataclass(frozen=True)
class EnvelopeParams:
    """The confidence levels of a tract's uncertainty envelopes (:mod:`app.envelopes`)."""

    levels: str = field(
        default="50,90,95",
        metadata=meta(
            "Envelope levels",
            "comma-separated percentages: each envelope is the smallest region holding that share of the "
            "normalised visitation (strictly between 0 and 100)",
            "%",
        ),
    )


@dataclass(frozen=True)
class ProbOutputParams:
    """What probabilistic tracking writes besides fdt_paths and the target matrices, and
    probtrackx2's connectome modes with their options."""

    seed_matrix: bool = field(
        default=False,
        metadata=meta(
            "Seed x seed matrix",
            "also count the seed x seed matrix (probtrackx's matrix1): matrix_seeds_to_seeds.npy/.csv",
        ),
    )
    save_paths_max: int = field(
        default=10_000,
        metadata=meta("Paths saved", "streamlines traced for --save-paths", "", (1, 10**7)),
    )
    # probtrackx2's connectome modes (app.pipelines.connectome_modes; FSL's flags and defaults).
    omatrix2: bool = field(
        default=False, metadata=meta("Matrix2", "seed x low-resolution --target2 voxels: fdt_matrix2.dot")
    )
    omatrix3: bool = field(
        default=False, metadata=meta("Matrix3", "--target3 x --target3 (or --lrtarget3) voxels: fdt_matrix3.dot")
    )
    network: bool = field(
        default=False,
        metadata=meta("Network", "--seed is a text file listing masks; each seeded, counted to the others"),
    )
    distthresh: float = field(
        default=0.0, metadata=meta("Distance threshold", "discard streamlines shorter than this", "mm", (0.0, 1e4))
    )
    distthresh3: float = field(
        default=0.0,
        metadata=meta("Matrix3 distance threshold", "leave shorter streamlines out of matrix3", "mm", (0.0, 1e4)),
    )
    pd: bool = field(default=False, metadata=meta("Distance-corrected", "weight counts by the path length"))
    ompl: bool = field(
        default=False, metadata=meta("Mean path length", "also write mean path lengths (fdt_paths_lengths, *_lengths)")
    )
    matrix_format: str = field(
        default="dot",
        metadata=meta(
            "Matrix format",
            "dot: FSL's sparse text; npz: SciPy sparse; both",
            choices=("dot", "npz", "both"),
        ),
    )

    def __post_init__(self):
        if not (self.distthresh >= 0 and self.distthresh3 >= 0):
            raise ValueError("--distthresh and --distthresh3 are lengths: give values of at least 0 mm")


@dataclass(frozen=True)
class TractogramOutputParams:
    """How a tracking command writes its tractogram."""

    positions_dtype: str = field(
        default="float32",
        metadata=meta(
            "Positions",
            "number type of the written points: float16 halves a .trx file (about 0.01 mm at 100 mm); "
            ".trk and .tck hold float32",
            choices=("float32", "float16"),
        ),
    )


@dataclass(frozen=True)
class ReportParams:
    """The report of a session (``tractlens report``)."""

    margin_mm: float | None = same_as(LesionDistanceParams, "margin_mm", default=None)
    size: str = field(
        default="1600x1000",
        metadata=meta("Window size", "window size WIDTHxHEIGHT"),
    )
    png: bool = field(
        default=True,
        metadata=meta(
            "PNG pages",
            "a PNG per page beside the PDF",
        ),
    )


#: Every parameter class: the engine's and the use cases'.
SAMPLINGS = ("nearest", "trilinear")


@dataclass(frozen=True)
class StatisticsParams:
    """How scalar maps are sampled along streamlines and in regions."""

    sampling: str = field(
        default="nearest",
        metadata=meta(
            "Map sampling",
            "a scalar map's value at a streamline point: the nearest voxel's, or trilinear between voxels",
            choices=SAMPLINGS,
        ),
    )

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, not {self.sampling!r}")


#: What ``export-dicom`` writes (``--as``): a Segmentation, an RT Structure Set, a coloured series.
DICOM_EXPORTS = ("seg", "rtstruct", "overlay", "tractography")


@dataclass(frozen=True)
class DicomExportParams:
    """What the export for neuronavigation and PACS writes, and how a bundle becomes a volume."""

    formats: str = field(
        default="seg,rtstruct,overlay",
        metadata={
            **meta(
                "DICOM objects",
                "comma-separated: seg (Segmentation), rtstruct (RT Structure Set), overlay (the reference "
                "series with the bundles burned in, not for diagnosis), tractography (the streamlines as a "
                "Tractography Results object, one track set per bundle)",
            ),
            "several": DICOM_EXPORTS,  # any of them, comma-separated: a check box each in a form
        },
    )
    dilate_mm: float = field(
        default=0.0,
        metadata=meta(
            "Dilate bundles",
            "grow each bundle's volume (the voxels its streamlines pass through) by this distance",
            "mm",
            (0.0, 20.0),
        ),
    )
    deidentify: bool = field(
        default=False,
        metadata=meta(
            "De-identify",
            "remove the patient's name, ID, birth date and the other identifiers (UIDs of the source stay)",
        ),
    )

    def __post_init__(self) -> None:
        unknown = [f for f in self.kinds if f not in DICOM_EXPORTS]
        if unknown or not self.kinds:
            raise ValueError(f"--as takes a comma-separated list of {', '.join(DICOM_EXPORTS)}, not {self.formats!r}")
        if not 0.0 <= self.dilate_mm <= 20.0:
            raise ValueError(f"the dilation must be between 0 and 20 mm, not {self.dilate_mm:g}")

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(part.strip().lower() for part in self.formats.split(",") if part.strip())


@dataclass(frozen=True)
class DicomImportParams:
    """How ``import-dicom`` names the subject and whether it keeps the patient's identifiers."""

    subject: str = field(
        default="",
        metadata=meta(
            "Subject",
            "BIDS subject label, letters and digits (empty: the patient ID without other characters, else 01)",
        ),
    )
    deidentify: bool = same_as(
        DicomExportParams,
        "deidentify",
        help="leave the patient's name, ID, birth date and the other identifiers out of the JSON sidecars "
        "(the subject is then 01 unless --subject names it)",
    )


@dataclass(frozen=True)
class ProfileTableParams:
    """Who the rows of a tidy profile table belong to (``tractlens profile --bundles``): the
    subject and session columns, e.g. ``sub-01`` and ``ses-pre`` (None: the ``sub-XX`` and
    ``ses-YY`` found in the paths of the bundles folder and maps, else empty)."""

    subject: str | None = field(
        default=None,
        metadata=meta("Subject", "the subject column of every row (BIDS sub-XX keeps it text for pandas)"),
    )
    session: str | None = field(
        default=None,
        metadata=meta("Session", "the session column of every row (may be empty)"),
    )


PARAMS_TYPES = (
    DTIFitParams,
    CSDParams,
    PeakParams,
    BallStickParams,
    ModelFitParams,
    DeterministicParams,
    FodDeterministicParams,
    FodProbabilisticParams,
    SeedingParams,
    GeodesicParams,
    MetricParams,
    GeodesicSeedingParams,
    ProbParams,
    ProbOutputParams,
    TractogramOutputParams,
    CommitParams,
    ConnectomeParams,
    EndpointParams,
    ProfileParams,
    ProfileTableParams,
    LesionDistanceParams,
    EnvelopeParams,
    ReportParams,
    StatisticsParams,
    DicomExportParams,
    DicomImportParams,
    RegisterParams,
    BundleParams,
)


#: The window's starting values where they differ from the defaults (which the command line and
#: scripts use): ``{parameter class: {field: value}}``, declared here beside the defaults so that
#: no panel keeps a number of its own. The probabilistic panel starts at 1000 samples per seed
#: voxel, a first look back in seconds; probtrackx's (and ``tractlens track probabilistic``'s)
#: 5000 is one edit away.
GUI_PRESETS: dict[type, dict[str, object]] = {
    ProbParams: {"n_samples": 1000},
}


def gui_preset(params_type: type, name: str):
    """The value a panel's form starts with: its :data:`GUI_PRESETS` entry, else the default."""
    return GUI_PRESETS.get(params_type, {}).get(name, default_of(params_type, name))
