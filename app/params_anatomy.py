"""The parameters of the anatomy use cases: registration and named bundles (re-exported by
:mod:`app.params`, where every parameter class is listed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tractlens.gpu.params import meta

REGISTRATION_TYPES = ("rigid", "affine", "syn")
REGISTRATION_METRICS = ("mi", "cc")


@dataclass(frozen=True)
class RegisterParams:
    """How two images are registered."""

    type: str = field(
        default="affine",
        metadata=meta(
            "Transform",
            "rigid; affine (rigid first); syn: affine, then a symmetric diffeomorphic warp",
            choices=REGISTRATION_TYPES,
        ),
    )
    metric: str = field(
        default="mi",
        metadata=meta(
            "Metric",
            "mi: for images of different contrasts (T1 ↔ b0 or FA, FLAIR ↔ T1): mutual information, and the "
            "expectation-maximisation metric in SyN's nonlinear stage; cc: for the same contrast (T1 ↔ the MNI T1): "
            "mutual information for the affine stages and cross-correlation in SyN's",
            choices=REGISTRATION_METRICS,
        ),
    )
    spacing_mm: float = field(
        default=2.0,
        metadata=meta(
            "Working grid",
            "the registration is optimised on a grid this coarse or coarser (the "
            "coarser image's voxels); nonlinear fields are written on it",
            "mm",
            (0.5, 8.0),
        ),
    )
    sampling: float = field(
        default=0.05,
        metadata=meta(
            "Sampling",
            "share of the working grid's voxels the mutual information is computed on (1 = all; at least "
            "10,000 of them): 5 % is 45,000 points of a 2 mm head, as accurate as 10 % on the benchmark's "
            "cases in half the time",
            "",
            (0.01, 1.0),
        ),
    )
    bins: int = field(
        default=32,
        metadata=meta("Histogram bins", "bins of the joint histogram of mutual information", "", (8, 256)),
    )
    affine_iterations: tuple[int, ...] = field(
        default=(100, 50, 20),
        metadata=meta(
            "Affine iterations",
            "iterations at each level, coarse (4×) to fine (1×)",
            "",
            (1, 10000),
        ),
    )
    syn_iterations: tuple[int, ...] = field(
        default=(20, 10, 5),
        metadata=meta(
            "SyN iterations",
            "iterations of the nonlinear stage at each level, coarse to fine",
            "",
            (1, 1000),
        ),
    )
    syn_radius: int = field(
        default=3,
        metadata=meta(
            "CC radius",
            "half-width of the cross-correlation window of the nonlinear stage",
            "voxels",
            (1, 8),
        ),
    )
    rng_seed: int = field(
        default=0,
        metadata=meta(
            "Random seed",
            "the sampled points of mutual information; the same number gives the same transform",
            "",
            (0, 2**31 - 1),
        ),
    )

    def __post_init__(self):
        if self.type not in REGISTRATION_TYPES:
            raise ValueError(f"type is one of {', '.join(REGISTRATION_TYPES)}, not {self.type!r}")
        if self.metric not in REGISTRATION_METRICS:
            raise ValueError(f"metric is one of {', '.join(REGISTRATION_METRICS)}, not {self.metric!r}")
        if not 0 < self.sampling <= 1:
            raise ValueError(f"sampling is a share in (0, 1], not {self.sampling}")
        if not self.affine_iterations or min(self.affine_iterations) < 1:
            raise ValueError("affine iterations need at least one level of at least 1 iteration")
        if not self.syn_iterations or min(self.syn_iterations) < 1:
            raise ValueError("SyN iterations need at least one level of at least 1 iteration")
        if self.spacing_mm <= 0:
            raise ValueError(f"the working grid spacing must be positive, not {self.spacing_mm}")


@dataclass(frozen=True)
class BundleParams:
    """Named-bundle tracking (``tractlens bundles``): how the MNI protocol regions become subject
    masks, what is kept of each bundle and how its volume is measured. The engines' own
    parameters (probabilistic: :class:`ProbParams`; fODF: :class:`FodProbabilisticParams`, whose
    step, angle and lengths the tensor engine takes too) come beside it."""

    region_threshold: float = field(
        default=0.5,
        metadata=meta(
            "Region partial volume",
            "a subject voxel joins a warped protocol region when at least this share of it lies inside "
            "(sampled at 2 x 2 x 2 points; 0.5 is the nearest-neighbour rule for a voxel on the edge)",
            "",
            (0.01, 1.0),
        ),
    )
    keep_streamlines: int = field(
        default=2000,
        metadata=meta(
            "Streamlines kept",
            "probabilistic engine: kept streamlines traced again and saved per bundle (NAME.trx), a sample of the "
            "waytotal",
            "",
            (1, 10**7),
        ),
    )
    seeds_per_voxel: int = field(
        default=10,
        metadata=meta("Seeds per voxel", "fODF and tensor engines: seeds in every seed voxel", "", (1, 1000)),
    )
    volume_threshold: float = field(
        default=0.001,
        metadata=meta(
            "Volume threshold",
            "the bundle volume counts voxels whose density (visits / waytotal) reaches this (XTRACT's 0.1 %)",
            "",
            (0.0, 1.0),
        ),
    )

    def __post_init__(self):
        if not 0 < self.region_threshold <= 1:
            raise ValueError(f"the region partial volume is a share in (0, 1], not {self.region_threshold}")
        if self.keep_streamlines < 1 or self.seeds_per_voxel < 1:
            raise ValueError("keep_streamlines and seeds_per_voxel must be at least 1")
        if not 0 <= self.volume_threshold <= 1:
            raise ValueError(f"the volume threshold is a share in [0, 1], not {self.volume_threshold}")
