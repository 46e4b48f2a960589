"""Use case: filter a tractogram with COMMIT — ``tractlens commit``, the COMMIT panel's Filter,
the batch step and Python all go through :func:`filter_with_commit` (files: :func:`commit_from_files`).

The inputs are checked here once, with one set of messages: a DWI series and a tractogram
with streamlines are needed; a mask on another grid than the DWI series is resampled onto it
by nearest neighbour (:func:`app.pipelines.select.mask_on_reference`, the grid rule of
:class:`app.grid.Grid`) and a note says so; an empty mask, or one outside the DWI's volume, is
refused; a peaks file must exist. :func:`check_commit_inputs` is the cheap part of those
checks, for a caller that wants to refuse before it starts a job (the window).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..grid import Grid
from ..io import load_dwi, load_tractogram
from ..io._atomic import split_suffix
from ..io.dwi import DWI
from ..io.nifti import check_exists
from ..io.tractogram_mapped import open_trx_mm
from ..io.tractogram_mapped_tck import open_tck_mm
from ..model import Tractogram
from ..pipelines.commit import CommitParams, CommitResult, commit_pipeline
from ..pipelines.select import load_masks_on_reference, mask_on_reference
from ..timing import phase

__all__ = ["CommitInputs", "check_commit_inputs", "commit_from_files", "commit_inputs", "filter_with_commit"]

#: What the mask is called in the messages.
MASK_WHAT = "white-matter mask"
#: What the mask is brought onto.
MASK_REFERENCE = "the DWI series"


@dataclass
class CommitInputs:
    """COMMIT's inputs once checked: the mask (None: every voxel the streamlines pass) on the DWI's grid."""

    dwi: DWI
    tractogram: Tractogram
    mask: np.ndarray | None = None
    peaks: Path | None = None
    notes: list[str] = field(default_factory=list)


def _mask_name(mask, name) -> str:
    return str(name or getattr(mask, "name", "") or "the mask")


def check_commit_inputs(
    dwi: DWI | None,
    tractogram: Tractogram | None,
    *,
    mask=None,
    peaks: str | os.PathLike | None = None,
    tractogram_name: str | os.PathLike | None = None,
    mask_name: str | None = None,
) -> None:
    """Refuse what COMMIT cannot use (:class:`InputError`), without reading or resampling
    anything: no DWI series, no tractogram or one without streamlines, an empty mask, a peaks
    file that does not exist. ``mask``: a file, or a region in memory (a model
    :class:`~app.model.RoiMask`: ``.mask`` and its grid)."""
    if dwi is None:
        raise InputError("no DWI series: COMMIT fits its signal", fix="Open a DWI series first (File ▸ Open)")
    if tractogram is None:
        raise InputError("no tractogram: COMMIT weighs its streamlines", fix="Open or track a tractogram first")
    if len(tractogram) == 0:
        raise InputError(
            "the tractogram holds 0 streamlines: COMMIT needs at least one",
            path=tractogram_name,
            fix="Track again with other regions or parameters, or give another tractogram",
        )
    if mask is not None and not isinstance(mask, str | os.PathLike) and not np.asarray(mask.mask).any():
        raise InputError(
            f"the {MASK_WHAT} is empty (no non-zero voxel)",
            path=_mask_name(mask, mask_name),
            fix="Give a non-empty region",
        )
    if peaks is not None:
        check_exists(peaks, "peaks file")


def commit_inputs(
    dwi: DWI | None,
    tractogram: Tractogram | None,
    *,
    mask=None,
    peaks: str | os.PathLike | None = None,
    tractogram_name: str | os.PathLike | None = None,
    mask_name: str | None = None,
) -> CommitInputs:
    """:func:`check_commit_inputs`, then the mask (a file, or a region in memory) read and
    brought onto the DWI's grid."""
    check_commit_inputs(dwi, tractogram, mask=mask, peaks=peaks, tractogram_name=tractogram_name, mask_name=mask_name)
    grid = Grid.of(dwi)
    notes: list[str] = []
    mask_array = None
    if isinstance(mask, str | os.PathLike):
        (mask_array,) = load_masks_on_reference([mask], MASK_WHAT, grid.affine, grid.shape, notes, MASK_REFERENCE)
    elif mask is not None:
        mask_array = mask_on_reference(
            mask.mask, mask.affine, MASK_WHAT, _mask_name(mask, mask_name), grid.affine, grid.shape, notes,
            MASK_REFERENCE,
        )  # fmt: skip
    return CommitInputs(dwi, tractogram, mask_array, None if peaks is None else Path(peaks), notes)


def filter_with_commit(
    dwi: DWI | None,
    tractogram: Tractogram | None,
    *,
    mask=None,
    peaks: str | os.PathLike | None = None,
    peaks_frame: str = "world",
    params: CommitParams | None = None,
    device: str = "auto",
    progress=None,
    cancelled=None,
    max_block_segments: int | None = None,
    tractogram_name: str | os.PathLike | None = None,
    mask_name: str | None = None,
    notes: Sequence[str] = (),
    gpus: int = 1,
) -> CommitResult:
    """Weigh ``tractogram``'s streamlines by how well they explain ``dwi``'s signal (COMMIT):
    the inputs checked (:func:`commit_inputs`), then :func:`app.pipelines.commit.commit_pipeline`.
    ``progress(iteration, max_iter)`` and ``cancelled()`` are passed on to the fit; ``notes``
    (e.g. what reading the DWI found) come after the input checks' notes in the result's.
    ``gpus`` > 1: the operator split by voxel rows over that many GPUs of this host."""
    inputs = commit_inputs(
        dwi, tractogram, mask=mask, peaks=peaks, tractogram_name=tractogram_name, mask_name=mask_name
    )
    result = commit_pipeline(
        inputs.dwi,
        inputs.tractogram,
        mask=inputs.mask,
        peaks=None if inputs.peaks is None else str(inputs.peaks),
        peaks_frame=peaks_frame,
        params=params,
        device=device,
        progress=progress,
        cancelled=cancelled,
        max_block_segments=max_block_segments,
        gpus=gpus,
    )
    result.notes[:0] = [*inputs.notes, *notes]
    return result


def commit_from_files(
    dwi_path,
    tractogram_path,
    *,
    bval=None,
    bvec=None,
    mask=None,
    peaks=None,
    peaks_frame: str = "world",
    params: CommitParams | None = None,
    device: str = "auto",
    progress=None,
    cancelled=None,
    max_block_segments: int | None = None,
    mapped: bool = True,
    gpus: int = 1,
) -> tuple[CommitResult, str]:
    """Load the inputs (the tractogram on the DWI's grid when it has none: .tck) and
    :func:`filter_with_commit`; returns the result and the tractogram's suffix (for the filtered
    output). ``mapped``: an uncompressed .trx (:mod:`app.io.tractogram_mapped`) or a plain .tck
    (:mod:`app.io.tractogram_mapped_tck`) is read as stored, in chunks, rather than into voxel
    coordinates; the streamlines written back are then its own positions."""
    with phase("read"):
        dwi = load_dwi(dwi_path, bval, bvec, read_only=True)  # its pages released once read
        # an uncompressed .trx or a plain .tck is used as stored (millimetres read in chunks: no
        # conversion, no copy of the points)
        tract = open_trx_mm(tractogram_path) if mapped else None
        if tract is None and mapped:
            tract = open_tck_mm(tractogram_path, dwi.affine, dwi.shape3)
        if tract is None:
            tract = load_tractogram(tractogram_path, reference=(dwi.affine, dwi.shape3))
    result = filter_with_commit(
        dwi,
        tract,
        mask=mask,
        peaks=peaks,
        peaks_frame=peaks_frame,
        params=params,
        device=device,
        progress=progress,
        cancelled=cancelled,
        max_block_segments=max_block_segments,
        tractogram_name=tractogram_path,
        notes=dwi.warnings,
        gpus=gpus,
    )
    return result, split_suffix(Path(tractogram_path))[1].lower()
