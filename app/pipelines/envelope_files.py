"""Use cases: uncertainty envelopes from a probtrackx-style output folder, written as one mask
per level plus ``envelopes.json``, and read back to measure their distance to a lesion
(``tractlens envelopes`` and ``tractlens distance --envelopes``; the definition is
:mod:`app.envelopes`').

The inputs are checked before anything is written (a level outside (0, 100), a folder without
``fdt_paths``, a waytotal of 0), and the folder is written whole or not at all: the files go
into a temporary folder beside it first and are moved into place when all are complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..envelopes import LEVEL_MEANING, EnvelopeDistance, EnvelopeSet, envelopes, lesion_distances, parse_levels
from ..errors import InputError
from ..io.nifti import load_image, load_mask, save_volume

ENVELOPES_JSON = "envelopes.json"
DEFINITION = (
    "smallest set of voxels holding at least the level's share of the normalised visitation "
    "(fdt_paths / its sum); voxels taken most visited first, ties by the smaller C-order index"
)


def envelope_file(level: float) -> str:
    """The mask file of one level: ``envelope_95.nii.gz``, ``envelope_97.5.nii.gz``."""
    return f"envelope_{level:g}.nii.gz"


def read_visitation(prob_dir: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(fdt_paths, its affine, waytotal or None) of a probabilistic tracking output folder."""
    folder = Path(prob_dir)
    paths_file = folder / "fdt_paths.nii.gz"
    if not folder.is_dir() or not paths_file.is_file():
        raise InputError(
            "no fdt_paths.nii.gz here: not a probabilistic tracking output folder",
            path=folder,
            fix="Give the folder written by tractlens track probabilistic (or probtrackx)",
        )
    image = load_image(paths_file, "visitation map")
    waytotal = None
    if (folder / "waytotal").is_file():
        text = (folder / "waytotal").read_text(encoding="utf-8").split()
        try:
            waytotal = int(float(text[0])) if text else None
        except ValueError:
            raise InputError("waytotal does not hold a number", path=folder / "waytotal") from None
    return np.asarray(image.dataobj, dtype=np.float64), np.asarray(image.affine, dtype=float), waytotal


def make_envelopes(prob_dir: str | os.PathLike, levels="50,90,95") -> EnvelopeSet:
    """The envelopes of a probabilistic tracking output folder at ``levels`` (checked)."""
    levels = parse_levels(levels)  # before reading: a bad level is the user's first mistake
    paths, affine, waytotal = read_visitation(prob_dir)
    found = envelopes(paths, affine, levels, waytotal=waytotal)
    found.provenance = {"source": str(Path(prob_dir)), "definition": DEFINITION}
    return found


def envelopes_of_tractograms(paths, levels="50,90,95", reference=None) -> EnvelopeSet:
    """The envelopes of the streamlines of one or more tractograms (a bootstrap: a deterministic
    or fODF run repeated with perturbed seeds or posterior samples, one file per repetition, or
    one probabilistic fODF run) on the first file's grid (``reference`` for .tck files)."""
    from ..envelopes import streamline_visitation
    from ..io import load_tractogram

    levels = parse_levels(levels)
    visits, affine, shape, streamlines = None, None, None, 0
    for path in paths:
        tract = load_tractogram(path, reference=reference)
        if affine is None:
            affine, shape = np.asarray(tract.affine, dtype=float), tuple(int(n) for n in tract.dimensions)
            if not all(n > 0 for n in shape):
                raise InputError("the tractogram carries no grid", path=path,
                                 fix="Give --reference IMAGE (the grid of the diffusion data)")  # fmt: skip
            visits = np.zeros(shape, dtype=np.int64)
        visits += streamline_visitation(tract.points_on(affine), tract.offsets, shape)
        streamlines += len(tract)
    if streamlines == 0:  # said of the files given, not of a probabilistic run's waytotal
        raise InputError(
            "the tractogram holds 0 streamlines, so it has no envelopes"
            if len(paths) == 1
            else f"the {len(paths)} tractograms hold 0 streamlines, so they have no envelopes",
            path=paths[0] if len(paths) == 1 else None,
            fix="Give the tractograms of the repeated tracking (each with streamlines)",
        )
    found = envelopes(visits, affine, levels, waytotal=streamlines)
    found.provenance = {"source": [str(p) for p in paths], "definition": DEFINITION,
                        "visitation": "streamlines of the tractograms, each counted once per voxel it passes"}  # fmt: skip
    return found


def write_envelopes(found: EnvelopeSet, outdir: str | os.PathLike) -> dict[str, str]:
    """One uint8 mask per level and ``envelopes.json`` into ``outdir`` (all or nothing)."""
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise InputError("the output path exists and is not a folder", path=out)
    names = [envelope_file(e.level) for e in found.envelopes] + [ENVELOPES_JSON]
    clash = [name for name in names if (out / name).exists()]
    if clash:
        raise InputError(f"{clash[0]} exists already", path=out,
                         fix="Give an empty output folder (-o), or move the earlier envelopes away")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".envelopes-", dir=out))
    try:
        for envelope in found.envelopes:
            save_volume(envelope.mask.astype(np.uint8), found.affine, staging / envelope_file(envelope.level))
        summary = {
            "meaning": LEVEL_MEANING,
            **found.provenance,
            "definition": DEFINITION,
            "total_visits": found.total_visits,
            "waytotal": found.waytotal,
            "levels": [{**e.summary(), "file": envelope_file(e.level)} for e in found.envelopes],
        }
        (staging / ENVELOPES_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        for name in names:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {name: str(out / name) for name in names}


def read_envelopes(env_dir: str | os.PathLike) -> EnvelopeSet:
    """The envelopes written by :func:`write_envelopes` (masks and summary)."""
    from ..envelopes import Envelope

    folder = Path(env_dir)
    try:
        summary = json.loads((folder / ENVELOPES_JSON).read_text(encoding="utf-8"))
        levels = summary["levels"]
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(
            f"no readable {ENVELOPES_JSON} here: not an envelopes folder",
            path=folder,
            fix="Give the folder written by tractlens envelopes",
        ) from None
    found, affine = [], None
    for entry in levels:
        image = load_image(folder / entry["file"], "envelope mask")
        affine = np.asarray(image.affine, dtype=float)
        mask = np.asarray(image.dataobj) > 0
        found.append(Envelope(float(entry["level"]), mask, int(mask.sum()), float(entry.get("volume_mm3", 0.0)),
                              float(entry.get("share", 0.0)), int(entry.get("min_visits", 0))))  # fmt: skip
    if not found:
        raise InputError(f"{ENVELOPES_JSON} lists no level", path=folder, fix="Make the envelopes again")
    return EnvelopeSet(found, affine, int(summary.get("total_visits", 0)), summary.get("waytotal"),
                       {"source": str(folder)})  # fmt: skip


def envelope_distances(env_dir: str | os.PathLike, lesion_path: str | os.PathLike) -> list[EnvelopeDistance]:
    """The lesion's distance to each envelope of a folder (:func:`app.envelopes.lesion_distances`)."""
    found = read_envelopes(env_dir)
    lesion = load_mask(lesion_path, what="lesion mask")
    return lesion_distances(found, lesion, load_image(lesion_path, "lesion mask").affine)
