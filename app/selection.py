"""Which fibres the document's ROIs select: the live selection shown while ROIs are drawn.

A streamline is kept when it passes every visible include ROI (seed, target, waypoint) and no
exclusion ROI; with exclusion ROIs only, every streamline inside the volume that avoids them.
The tractograms' points on the reference grid (a :class:`~tractlens.gpu.select.StreamlineIndex`,
resident on the compute device) are derived data: the document's
:class:`~tractlens.app.derived.DerivedCache` keeps one per tractogram, grid and device, so an ROI
edit re-selects without rebuilding it and removing the tractogram frees it.
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

    @classmethod
    def of(cls, document: Document) -> RoiSelection | None:
        """The document's selection as it is now; None without tractograms or without ROIs."""
        tracts = tuple(layer for layer in document.layers if layer.kind == "tractogram")
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
    """(layer, selected: bool per streamline) for every tractogram of ``request``. ``check`` is
    called before each tractogram (a job's ``ctx.check`` raises when it was cancelled);
    ``cancelled`` is polled during a selection."""
    out = []
    for layer in request.tracts:
        if check is not None:
            check()
        index = streamline_index(document, layer, request.reference_affine, device)
        result = index.select(list(request.include), list(request.exclude), cancelled=cancelled)
        out.append((layer, result.selected))
    return out
