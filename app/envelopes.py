"""Uncertainty envelopes of a tract: the regions where it lies at stated confidence levels, from
a probabilistic path distribution (probtrackx's ``fdt_paths``), and their distance to a lesion.

Definition (what a level means). Let :math:`v(x) \\ge 0` be the visitation count of voxel
:math:`x` (kept streamlines through it) and :math:`V = \\sum_x v(x)`; the normalised
visitation :math:`p(x) = v(x) / V` sums to one over the grid. The envelope at level
:math:`\\alpha` % is the **smallest set of voxels holding at least** :math:`\\alpha` % **of the
normalised visitation**:

.. math:: E_\\alpha = \\{x_1, \\dots, x_n\\}, \\quad
          n = \\min \\{ m : \\textstyle\\sum_{i \\le m} v(x_i) \\ge \\tfrac{\\alpha}{100} V \\},

with the voxels ordered by visitation, most visited first: :math:`v(x_1) \\ge v(x_2) \\ge \\dots`.
Taking the most visited voxels first makes the set the smallest one with that share (a highest
density region of the distribution). Ties are broken deterministically: among voxels with the
same count, the one with the smaller index in C order (``i``, then ``j``, then ``k``) comes
first, so the same map always gives the same envelope. The share is compared exactly, in
integers (the level as a fraction with denominator at most 10⁶). Because every level takes a
prefix of the same ordering, the envelopes are nested: :math:`E_{50} \\subseteq E_{90}
\\subseteq E_{95}`. A level must lie strictly between 0 and 100 % (at 100 % the envelope would
be every voxel any kept streamline touched, the least robust region of all).

In words, for a report: "the 95 % envelope is the smallest region that holds 95 % of the
visits of the probabilistic streamlines: the tract lies within it with 95 % of its sampled
paths' weight; a wider envelope at a higher level".

The visitation map may also come from streamlines (:func:`streamline_visitation`): a
bootstrap of a deterministic or fODF run, repeated with perturbed seeds or posterior samples,
each streamline counting once in every voxel it passes.

Distance to a lesion (:func:`lesion_distances`): per level, the smallest distance in
millimetres between the centre of a voxel of the envelope and the centre of a voxel of the
lesion, in world coordinates (each on its own grid), 0 when the envelope overlaps the lesion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .errors import InputError

#: The levels (%) of :func:`envelopes` when none are given.
DEFAULT_LEVELS = (50.0, 90.0, 95.0)

#: The sentence a table or report puts beside envelope distances.
LEVEL_MEANING = (
    "An envelope at level L % is the smallest region holding L % of the visits of the probabilistic "
    "streamlines (the most visited voxels first); higher levels are wider regions that contain the lower ones."
)


def parse_levels(text: str | list | tuple) -> tuple[float, ...]:
    """Levels (%) from ``"50,90,95"`` (or numbers), sorted, each strictly between 0 and 100."""
    items = [str(v).strip().rstrip("%") for v in (text.split(",") if isinstance(text, str) else text)]
    items = [v for v in items if v]
    if not items:
        raise InputError("no envelope level given", fix="Give levels in percent, e.g. --levels 50,90,95")
    levels = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            raise InputError(
                f"envelope level {item!r} is not a number", fix="Give levels in percent, e.g. --levels 50,90,95"
            ) from None
        if not 0.0 < value < 100.0:
            raise InputError(
                f"envelope level {item} % lies outside (0, 100)",
                fix="Give each level as a percentage strictly between 0 and 100, e.g. --levels 50,90,95",
            )
        levels.append(value)
    if len(set(levels)) != len(levels):
        raise InputError("an envelope level is given twice", fix="Give each level once")
    return tuple(sorted(levels))


@dataclass
class Envelope:
    """One level's region: ``mask`` on the map's grid, its voxels, volume (mm³), the share of the
    visitation it holds (≥ the level) and the smallest visitation count in it."""

    level: float
    mask: np.ndarray
    voxels: int
    volume_mm3: float
    share: float
    min_visits: int

    @property
    def label(self) -> str:
        return f"{self.level:g} %"

    def summary(self) -> dict:
        return {"level": self.level, "voxels": self.voxels, "volume_mm3": round(self.volume_mm3, 3),
                "share": round(self.share, 6), "min_visits": self.min_visits}  # fmt: skip


@dataclass
class EnvelopeSet:
    """The envelopes of one path distribution, smallest level first, on ``affine``'s grid."""

    envelopes: list[Envelope]
    affine: np.ndarray
    total_visits: int
    waytotal: int | None = None
    provenance: dict = field(default_factory=dict)


def visit_order(paths: np.ndarray) -> np.ndarray:
    """Flat (C order) voxel indices, most visited first, ties by the smaller index."""
    flat = np.asarray(paths).ravel()
    return np.lexsort((np.arange(flat.size), -flat.astype(np.int64)))


def _count_for(level: float, cumulative: np.ndarray, total: int) -> int:
    share = Fraction(level).limit_denominator(10**6) / 100
    need = -(-(share.numerator * total) // share.denominator)  # ceil(share × total), exactly
    return int(np.searchsorted(cumulative, need, side="left")) + 1


def envelopes(
    paths: np.ndarray, affine: np.ndarray, levels=DEFAULT_LEVELS, *, waytotal: int | None = None
) -> EnvelopeSet:
    """The envelopes of a path distribution at ``levels`` (%) (see the module docstring).

    ``paths``: visitation counts (non-negative, whole numbers; probtrackx's fdt_paths).
    ``waytotal``: the kept streamlines, when known; 0 is refused (no distribution)."""
    levels = parse_levels(levels)
    values = np.asarray(paths)
    if values.ndim != 3:
        raise InputError(f"the visitation map must be 3-D, not {values.ndim}-D")
    if not np.isfinite(values).all() or (values < 0).any():
        raise InputError("the visitation map holds negative or non-finite values", fix="Give probtrackx's fdt_paths")
    counts = np.rint(values).astype(np.int64)
    total = int(counts.sum())
    if waytotal == 0 or total == 0:
        raise InputError(
            "the visitation map is empty (waytotal 0: no streamline was kept), so it has no envelopes",
            fix="Track again with a seed and waypoints that keep streamlines (see the tracking's notes)",
        )
    order = visit_order(counts)
    cumulative = np.cumsum(counts.ravel()[order])
    voxel_mm3 = float(abs(np.linalg.det(np.asarray(affine, dtype=float)[:3, :3])))
    found = []
    for level in levels:
        n = _count_for(level, cumulative, total)
        mask = np.zeros(counts.size, dtype=bool)
        mask[order[:n]] = True
        share, least = int(cumulative[n - 1]) / total, int(counts.ravel()[order[n - 1]])
        found.append(Envelope(level, mask.reshape(counts.shape), n, n * voxel_mm3, share, least))
    return EnvelopeSet(found, np.asarray(affine, dtype=float), total, waytotal)


def envelope_set_of_masks(levels, masks, affine: np.ndarray) -> EnvelopeSet:
    """Envelopes already made (e.g. layers of a document): their levels and masks on ``affine``'s grid."""
    voxel_mm3 = float(abs(np.linalg.det(np.asarray(affine, dtype=float)[:3, :3])))
    found = []
    for level, mask in zip(levels, masks, strict=True):
        mask = np.asarray(mask, dtype=bool)
        found.append(Envelope(float(level), mask, int(mask.sum()), int(mask.sum()) * voxel_mm3, float("nan"), 0))
    return EnvelopeSet(found, np.asarray(affine, dtype=float), 0)


def streamline_visitation(points_vox: np.ndarray, offsets: np.ndarray, shape) -> np.ndarray:
    """A visitation map from streamlines (voxel coordinates of a grid of ``shape``): per voxel,
    the streamlines passing through it, each counted once however often it passes, as probtrackx
    counts. Each segment is sampled every quarter voxel (at least its two ends) and a sample falls
    in the voxel whose centre is nearest. The streamlines of a bootstrap — a deterministic or
    fODF run repeated with perturbed seeds or posterior samples — give the map whose envelopes
    say where the tract lies across the repetitions."""
    points = np.asarray(points_vox, dtype=np.float64).reshape(-1, 3)
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(len(counts)), counts)
    samples, owners = [points], [owner]
    starts = np.flatnonzero(np.diff(owner) == 0)  # segment i joins points i and i + 1 of one streamline
    if starts.size:
        delta = points[starts + 1] - points[starts]
        steps = np.maximum(1, np.ceil(np.abs(delta).max(axis=1) * 4)).astype(np.int64)
        which = np.repeat(np.arange(starts.size), steps)
        within = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
        samples.append(points[starts][which] + (within / steps[which])[:, None] * delta[which])
        owners.append(owner[starts][which])
    index = np.rint(np.concatenate(samples)).astype(np.int64)
    owner = np.concatenate(owners)
    inside = np.all((index >= 0) & (index < np.asarray(shape)), axis=1)
    flat = np.ravel_multi_index(tuple(index[inside].T), tuple(shape))
    pairs = np.unique(owner[inside] * int(np.prod(shape)) + flat)  # (streamline, voxel) once each
    return np.bincount(pairs % int(np.prod(shape)), minlength=int(np.prod(shape))).reshape(shape)


def centres_mm(mask: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """World coordinates (mm) of the centres of a mask's voxels."""
    ijk = np.argwhere(mask).astype(np.float64)
    return ijk @ np.asarray(affine, dtype=float)[:3, :3].T + np.asarray(affine, dtype=float)[:3, 3]


@dataclass
class EnvelopeDistance:
    """The lesion's distance to one envelope: closest centre-to-centre distance (mm; 0 when they
    overlap) and the envelope voxels inside the lesion."""

    level: float
    min_mm: float
    overlap_voxels: int

    def as_dict(self) -> dict:
        return {"level": self.level, "min_mm": round(self.min_mm, 3), "overlap_voxels": self.overlap_voxels}


def lesion_distances(
    envelope_set: EnvelopeSet, lesion: np.ndarray, lesion_affine: np.ndarray
) -> list[EnvelopeDistance]:
    """Per envelope, the distance to ``lesion`` (see the module docstring): a k-d tree over the
    lesion's voxel centres, queried with the envelope's (exact nearest centres)."""
    from scipy.spatial import cKDTree

    from .grid import Grid

    lesion = np.asarray(lesion, dtype=bool)
    if lesion.ndim != 3 or not lesion.any():
        raise InputError("the lesion mask is empty (or not 3-D)", fix="Draw or load the lesion first")
    tree = cKDTree(centres_mm(_surface(lesion), lesion_affine))
    grid = Grid(envelope_set.affine, envelope_set.envelopes[0].mask.shape)
    on_grid = grid.resample_nearest(lesion, Grid(np.asarray(lesion_affine, float), lesion.shape)).astype(bool)
    out = []
    for envelope in envelope_set.envelopes:
        overlap = int((envelope.mask & on_grid).sum())
        if overlap:
            out.append(EnvelopeDistance(envelope.level, 0.0, overlap))
            continue
        distance, _ = tree.query(centres_mm(envelope.mask, envelope_set.affine), k=1)
        out.append(EnvelopeDistance(envelope.level, float(distance.min()), 0))
    return out


def _surface(mask: np.ndarray) -> np.ndarray:
    """The voxels of ``mask`` with a neighbour outside it (the nearest lesion voxel to any point
    outside the lesion is one of them): fewer points for the tree."""
    from scipy.ndimage import binary_erosion

    inner = binary_erosion(mask, border_value=0)
    return mask & ~inner
