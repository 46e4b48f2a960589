"""What the document's ROIs mean to each tracking method, written once.

The roles (:data:`app.model.ROI_ROLES`) mean the same to every panel and to the command line:

- **seed**: the union of the visible, non-empty seed ROIs; streamlines start there.
- **waypoint**: each ROI is one region that a kept streamline must pass; deterministic and
  geodesic tracking keep the streamlines that pass *all* of them (AND, as the command line's
  repeated ``--include`` and MRtrix's repeated ``-include``).
- **target**: deterministic tracking treats each target as a waypoint (AND). Geodesic tracking
  shoots fibres *to* a target: the targets together are the end region, a fibre is kept when
  it reaches one of them and ranked by its connectivity measure where it first does (a fibre
  ends in the first target it enters, so "all targets" would keep almost nothing). Probabilistic
  tracking (probtrackx) keeps them apart: every target is a classification target with its own
  ``seeds_to_{target}`` map, named after the ROI, and the waypoints are its waypoint masks
  (``--waycond`` AND/OR).
- **exclusion**: the union; a streamline that enters it is dropped (geodesic: it is taken
  out of the tracking mask, so no fibre enters it).
- **stop**: the union; streamlines end where they enter it (probabilistic: ``--stop``).
- **lesion**: no part in tracking; the Presurgical panel measures distances to it.

Hidden and empty ROIs take no part. An ROI on another grid than the method's (the tensor or
samples grid) is brought onto it by nearest neighbour, with a note; one that lies outside
that grid altogether is left out, with a note.

The snapshot (:func:`roi_snapshot`) copies the masks on the GUI thread; :func:`regions_on_grid`
is the O(grid) part, for a worker. :func:`regions_for` does both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .grid import Grid

#: The methods whose use of the roles the module docstring states.
METHODS = ("deterministic", "geodesic", "probabilistic")


@dataclass(frozen=True)
class RoiCopy:
    """A copy of one visible ROI layer's mask, taken on the GUI thread."""

    name: str
    role: str
    mask: np.ndarray
    affine: np.ndarray


@dataclass
class Region:
    """One target or waypoint: the ROI's name and its mask on the method's grid."""

    name: str
    mask: np.ndarray


@dataclass
class Regions:
    """The ROIs of a document as one method uses them, on ``grid`` (see the module docstring).

    ``seed``, ``exclusion`` and ``stop`` are unions (None: no such ROI); ``targets`` and
    ``waypoints`` keep one :class:`Region` per ROI, in layer order; ``notes`` say which ROIs
    were resampled or left out."""

    method: str
    grid: Grid
    seed: np.ndarray | None = None
    targets: list[Region] = field(default_factory=list)
    waypoints: list[Region] = field(default_factory=list)
    exclusion: np.ndarray | None = None
    stop: np.ndarray | None = None
    seed_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def must_pass(self) -> list[np.ndarray]:
        """Every target and waypoint mask: the regions a kept streamline passes, all of them
        (deterministic tracking)."""
        return [region.mask for region in (*self.targets, *self.waypoints)]

    @property
    def target_union(self) -> np.ndarray | None:
        """The targets together (geodesic tracking ranks fibres where they first reach it)."""
        masks = [region.mask for region in self.targets]
        return np.logical_or.reduce(masks) if masks else None


def roi_snapshot(document) -> list[RoiCopy]:
    """Copies of the visible, non-empty ROI layers of ``document`` (call on the GUI thread)."""
    return [
        RoiCopy(layer.name, layer.data.role, layer.data.mask.copy(), np.array(layer.data.affine, dtype=np.float64))
        for layer in document.layers
        if layer.kind == "roi" and layer.visible and layer.data.mask.any()
    ]


def regions_on_grid(rois: list[RoiCopy], method: str, grid: Any) -> Regions:
    """The snapshot's ROIs in their roles for ``method``, on ``grid`` (anything
    :meth:`Grid.of` takes: a tensor field, a volume, an (affine, shape) pair)."""
    if method not in METHODS:
        raise ValueError(f"unknown tracking method {method!r}: one of {', '.join(METHODS)}")
    grid = Grid.of(grid)
    regions = Regions(method, grid)
    by_role: dict[str, list[Region]] = {"seed": [], "target": [], "waypoint": [], "exclusion": [], "stop": []}
    for roi in rois:
        if not roi.mask.any() or roi.role not in by_role:  # a lesion takes no part in tracking
            continue
        source = Grid(roi.affine, roi.mask.shape)
        mask = np.asarray(roi.mask, dtype=bool)
        if not grid.matches(source):
            mask = grid.resample_nearest(mask, source)
            if not mask.any():
                regions.notes.append(f"ROI {roi.name} lies outside the {method} tracking grid: left out")
                continue
            regions.notes.append(f"ROI {roi.name} was on another grid: resampled (nearest neighbour)")
        by_role[roi.role].append(Region(roi.name, mask))
    regions.seed = _union(by_role["seed"])
    regions.seed_names = [region.name for region in by_role["seed"]]
    regions.targets = by_role["target"]
    regions.waypoints = by_role["waypoint"]
    regions.exclusion = _union(by_role["exclusion"])
    regions.stop = _union(by_role["stop"])
    return regions


def regions_for(document, method: str, grid: Any) -> Regions:
    """The document's ROIs as ``method`` uses them, on ``grid`` (see the module docstring)."""
    return regions_on_grid(roi_snapshot(document), method, grid)


def _union(regions: list[Region]) -> np.ndarray | None:
    return np.logical_or.reduce([region.mask for region in regions]) if regions else None
