"""Which fibres the document's ROIs select: the live selection shown while ROIs are drawn.

A streamline is kept when it passes every visible include ROI (seed, target, waypoint) and no
exclusion ROI; with exclusion ROIs only, every streamline inside the volume that avoids them.
The tractograms' points on the reference grid (a :class:`~tractlens.gpu.select.StreamlineIndex`,
resident on the compute device) are derived data: the document's
:class:`~tractlens.app.derived.DerivedCache` keeps one per tractogram, grid and device, so an ROI
edit re-selects without rebuilding it and removing the tractogram frees it.

What is shown is explicit state of a tractogram layer (``layer.selection``, and
``layer.selection_by``: what made it); :func:`shown_of` reads it for every count the window and
the report print ("12 of 92 shown (selection by ROIs seed, target)"), so no count includes fibres
the user cannot see, and :func:`empty_selection_notice` says why a selection shows none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .model import Document, Layer
from .pipelines.select import index_on_grid

STREAMLINE_INDEX = "streamline_index"  # the DerivedCache kind


@dataclass(frozen=True)
class RoiSelection:
    """A snapshot of what selects fibres, taken on the GUI thread so that a worker can select
    while the ROIs are edited: the tractogram layers, copies of the include and exclude masks
    (on the reference grid) and that grid's affine."""

    tracts: tuple[Layer, ...]
    include: tuple[np.ndarray, ...]
    exclude: tuple[np.ndarray, ...]
    reference_affine: np.ndarray
    roi_names: tuple[str, ...] = ()

    @property
    def by(self) -> str:
        """What the selection is made by, in words: ``"ROI target"``, ``"ROIs seed, target"``."""
        names = self.roi_names
        return f"ROI{'s' if len(names) != 1 else ''} {', '.join(names)}" if names else "ROIs"

    @classmethod
    def of(cls, document: Document) -> RoiSelection | None:
        """The document's selection as it is now, for the tractograms the user filters by ROIs
        (``layer.filter_by_rois``); None without such tractograms or without ROIs."""
        tracts = filtered_tractograms(document)
        include, exclude = document.roi_sets()
        if not tracts or (not include and not exclude):
            return None
        if not include:  # exclusion only: everything inside the volume that avoids it
            include = [np.ones(document.reference_shape, dtype=bool)]
        return cls(
            tracts,
            tuple(mask.copy() for mask in include),
            tuple(mask.copy() for mask in exclude),
            document.reference_affine.copy(),
            tuple(selecting_roi_names(document)),
        )


def filtered_tractograms(document: Document) -> tuple[Layer, ...]:
    """The tractogram layers the user chose to filter by the ROIs (layer menu "Filter by ROIs")."""
    return tuple(layer for layer in document.layers if layer.kind == "tractogram" and layer.filter_by_rois)


def selected_by_rois(layer: Layer) -> bool:
    """Is what a tractogram layer shows a selection the ROIs made (not a connectivity cell's)?"""
    return layer.selection is not None and (layer.selection_by or "").startswith("ROI")


def selecting_roi_names(document: Document) -> list[str]:
    """Names of the visible, non-empty ROIs that select fibres (as :meth:`Document.roi_sets`)."""
    return [
        layer.name
        for layer in document.layers
        if layer.kind == "roi"
        and layer.visible
        and layer.data.role in ("seed", "target", "waypoint", "exclusion")
        and layer.data.mask.any()
    ]


@dataclass(frozen=True)
class Shown:
    """How many of a tractogram's streamlines the views show, and what selected them."""

    shown: int
    total: int
    by: str | None = None  # None: no selection, every streamline is shown

    @property
    def selected(self) -> bool:
        return self.by is not None or self.shown != self.total

    @property
    def hides(self) -> bool:
        """Some streamlines are not shown."""
        return self.shown < self.total

    @property
    def text(self) -> str:
        """``"12 of 92 shown (selection by ROI target)"``, ``"all 92 shown"``."""
        by = f" (selection by {self.by or 'a selection'})" if self.selected else ""
        if not self.hides:
            return f"all {self.total:,} shown{by}"
        return f"{self.shown:,} of {self.total:,} shown{by}"


def shown_of(layer: Layer) -> Shown:
    """The streamlines of a tractogram layer the views show (its selection; all without one)."""
    total = len(layer.data)
    if layer.selection is None or len(layer.selection) != total:
        return Shown(total, total)
    return Shown(layer.selected_count(), total, layer.selection_by or "a selection")


def shown_mask(layer: Layer) -> np.ndarray:
    """Bool per streamline: shown in the views."""
    total = len(layer.data)
    if layer.selection is None or len(layer.selection) != total:
        return np.ones(total, dtype=bool)
    return np.asarray(layer.selection, dtype=bool)


def empty_selection_notice(layer: Layer) -> str | None:
    """Why a tractogram shows nothing although it has streamlines (None when it shows some)."""
    shown = shown_of(layer)
    if shown.shown or not shown.total or not shown.selected:
        return None
    return (
        f"{layer.name}: none of its {shown.total:,} streamlines is shown: none passes every visible seed, "
        f"target and waypoint ROI while avoiding the exclusion ROIs (selection by {shown.by}). "
        "Hide an ROI (layer list) to show them again."
    )


def has_selecting_rois(document: Document) -> bool:
    """Do any visible, non-empty ROIs select fibres (include or exclude)?"""
    include, exclude = document.roi_sets()
    return bool(include or exclude)


def streamline_index(document: Document, layer: Layer, reference_affine: np.ndarray, device: str = "auto"):
    """A tractogram layer's streamlines in voxel coordinates of the grid ``reference_affine``, on
    the compute device; built once per tractogram, grid and device (``document.derived``) and
    shared by every selection. Safe to call from worker threads."""
    reference = np.asarray(reference_affine, dtype=np.float64)
    key = (reference.tobytes(), device)
    return document.derived.get(layer.data, STREAMLINE_INDEX, key, lambda: index_on_grid(layer.data, reference, device))


def select_fibres(
    document: Document,
    request: RoiSelection,
    *,
    device: str = "auto",
    cancelled: Callable[[], bool] | None = None,
    check: Callable[[], None] | None = None,
) -> list[tuple[Layer, np.ndarray]]:
    """(layer, selected: bool per streamline) for every tractogram of ``request`` (show them with
    ``layer.set_selection(selected, by=request.by)``). ``check`` is
    called before each tractogram (a job's ``ctx.check`` raises when it was cancelled);
    ``cancelled`` is polled during a selection."""
    out = []
    for layer in request.tracts:
        if check is not None:
            check()
        index = streamline_index(document, layer, request.reference_affine, device)
        result = index.select(list(request.include), list(request.exclude), cancelled=cancelled)
        if result.ids is not None:  # found on the device beside the verdict: the views' ranges start from them
            document.fiber_arrays.seed_selection(layer, result.selected, result.ids, result.lengths, result.starts)
        out.append((layer, result.selected))
    return out
