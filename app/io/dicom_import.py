"""DICOM series converted to NIfTI by dcm2niix: into a folder the user names (``tractlens
import-dicom``), or on the fly into the cache when a command or the window is given a folder.

dcm2niix (Li et al., J Neurosci Methods 2016; its PyPI package ships the converter) reads the
geometry and the gradient tables of every vendor (Siemens CSA, GE, Philips, and the standard
(0018,9087)/(0018,9089) attributes) and writes the image with FSL ``.bval``/``.bvec`` files and a
BIDS JSON sidecar; TractLens adds the source's study, series and frame-of-reference UIDs to
that sidecar so that an export can refer back to them (:mod:`.dicom_export`).

Imported files are named the BIDS way: ``sub-LABEL/dwi/sub-LABEL_dwi.nii.gz``,
``sub-LABEL/anat/sub-LABEL_T1w.nii.gz`` (``_run-N`` when a kind occurs twice;
``_acq-DESCRIPTION_MR`` for a contrast BIDS has no name for). LABEL is the patient ID with
everything but letters and digits removed (BIDS labels are alphanumeric), the ``subject`` given,
or ``01`` when there is neither or when the import is de-identified (then dcm2niix also leaves
the patient fields out of the JSON sidecars). Everything is converted into a temporary folder
first and moved into place only when every series converted, so a failure leaves nothing behind.

The cache (``$TRACTLENS_CACHE/dicom`` or ``$XDG_CACHE_HOME/tractlens/dicom``, as the bedpostX
cache, :mod:`.bedpostx_cache`) holds one entry per folder and series; it is valid while every
file of the series has the size and modification time it had when converted.
``TRACTLENS_DICOM_CACHE=0`` converts into a temporary folder each time instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import Cancelled

from ..errors import InputError
from .bedpostx_cache import fingerprint
from .dicom_series import INSTALL_HINT, DicomSeries, choose, is_dicom_folder, list_series, require

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
#: The subject label when the patient ID gives none (or identifiers are not wanted).
DEFAULT_SUBJECT = "01"
#: What dcm2niix is told: gzip, BIDS sidecar with the patient fields (the presurgical report
#: prints them, :mod:`app.report_data`), no crop. De-identified: ``-ba y`` (no patient fields).
DCM2NIIX_FLAGS = ["-z", "y", "-b", "y", "-ba", "n", "-x", "n", "-v", "0"]
BIDS_SUFFIX = [
    (re.compile(r"flair", re.IGNORECASE), "FLAIR"),
    (re.compile(r"t1|mprage|spgr|bravo|tfe", re.IGNORECASE), "T1w"),
    (re.compile(r"t2", re.IGNORECASE), "T2w"),
    (re.compile(r"(^|[^a-z])pd", re.IGNORECASE), "PDw"),
]


@dataclass
class ConvertedSeries:
    """One series as NIfTI: the image, its gradient files (diffusion only) and JSON sidecar."""

    series: DicomSeries
    nifti: Path
    bval: Path | None = None
    bvec: Path | None = None
    sidecar: Path | None = None

    @property
    def kind(self) -> str:
        return "dwi" if self.bval is not None else "anat"

    def files(self) -> list[Path]:
        return [p for p in (self.nifti, self.bval, self.bvec, self.sidecar) if p is not None]

    def as_dict(self) -> dict:
        return {**self.series.as_dict(), "kind": self.kind, "files": [str(p) for p in self.files()]}


def _dcm2niix_binary(folder: Path) -> str:
    module = require("dcm2niix", folder)
    binary = getattr(module, "bin", None)
    if not binary or not Path(binary).exists():
        raise InputError("the dcm2niix package is installed without its converter program", path=folder,
                         fix=INSTALL_HINT)  # fmt: skip
    return binary


def _run_dcm2niix(series: DicomSeries, outdir: Path, deidentify: bool = False) -> list[Path]:
    """Convert one series' files (linked into a private folder, so nothing else is converted)."""

    binary = _dcm2niix_binary(series.files[0].parent)
    with tempfile.TemporaryDirectory(prefix="tractlens-dicom-") as staging:
        for i, path in enumerate(series.files):
            link = Path(staging) / f"{i:06d}.dcm"
            try:
                os.symlink(path.resolve(), link)
            except OSError:  # no symbolic links here (some Windows set-ups): copy
                shutil.copy2(path, link)
        flags = list(DCM2NIIX_FLAGS)
        if deidentify:
            flags[flags.index("-ba") + 1] = "y"
        result = subprocess.run(
            [binary, *flags, "-f", "series", "-o", str(outdir), staging],
            capture_output=True,
            text=True,
            check=False,
        )
    images = sorted(outdir.glob("series*.nii.gz"), key=lambda p: -p.stat().st_size)
    if not images:
        tail = " ".join((result.stderr or result.stdout or "").split())[-300:]
        raise InputError(
            f"dcm2niix could not convert series {series.label} ({tail or 'no image written'})",
            path=series.files[0].parent,
            fix="Check that the series holds images (not only reports); send the folder to support if it does",
        )
    return images


def convert_series(series: DicomSeries, outdir: Path, *, deidentify: bool = False) -> ConvertedSeries:
    """Convert ``series`` into ``outdir`` (named ``series.*``), check its gradient table and
    write the source UIDs into its sidecar (``deidentify``: without the patient fields)."""
    outdir.mkdir(parents=True, exist_ok=True)
    nifti = _run_dcm2niix(series, outdir, deidentify)[0]
    stem = nifti.name[: -len(".nii.gz")]
    bval, bvec, sidecar = (outdir / f"{stem}{ext}" for ext in (".bval", ".bvec", ".json"))
    bval = bval if bval.exists() and bvec.exists() else None
    if bval is not None and np.loadtxt(bval, ndmin=1).max() <= 50:
        bval = None  # b-values all 0: no diffusion weighting recorded
    if series.kind == "dwi" and bval is None:
        raise InputError(
            f"series {series.label} looks like diffusion data but has no gradient information "
            "(no b-values and directions in its headers)",
            path=series.files[0].parent,
            fix="Export the series again from the scanner with its diffusion headers (not as a secondary "
            "capture or anonymised copy), or convert it elsewhere and give its .bval/.bvec files",
        )
    if bval is not None:
        series.kind = "dwi"
    info = json.loads(sidecar.read_text(encoding="utf-8")) if sidecar.exists() else {}
    info.update(
        StudyInstanceUID=series.study_uid,
        SeriesInstanceUID=series.uid,
        FrameOfReferenceUID=series.frame_uid,
        TractLensSource="DICOM",
    )
    sidecar.write_text(json.dumps(info, indent=2), encoding="utf-8")
    return ConvertedSeries(series, nifti, bval, bvec if bval is not None else None, sidecar)


# --- the cache ---------------------------------------------------------------------------------


def cache_root() -> Path:
    root = os.environ.get("TRACTLENS_CACHE")
    if root:
        return Path(root) / "dicom"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tractlens" / "dicom"


def cache_enabled() -> bool:
    return os.environ.get("TRACTLENS_DICOM_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def entry_dir(folder: Path, series: DicomSeries) -> Path:
    key = f"{folder.resolve()}\0{series.uid}".encode("utf-8", "surrogatepass")
    return cache_root() / f"{hashlib.sha256(key).hexdigest()[:24]}-v{FORMAT_VERSION}"


def _load_entry(entry: Path, series: DicomSeries) -> ConvertedSeries | None:
    try:
        manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if manifest.get("format") != FORMAT_VERSION or manifest.get("sources") != fingerprint(series.files):
        return None
    files = {name: (entry / value if value else None) for name, value in manifest["files"].items()}
    if not all(p.exists() for p in files.values() if p is not None):
        return None
    series.kind = manifest.get("kind", series.kind)
    return ConvertedSeries(series, files["nifti"], files["bval"], files["bvec"], files["sidecar"])


def converted(folder: str | os.PathLike, series: DicomSeries) -> ConvertedSeries:
    """``series`` of ``folder`` as NIfTI, from the cache or converted into it now."""
    folder = Path(folder)
    entry = entry_dir(folder, series)
    if cache_enabled():
        hit = _load_entry(entry, series)
        if hit is not None:
            return hit
    prints = fingerprint(series.files)
    root = cache_root() if cache_enabled() else Path(tempfile.gettempdir()) / "tractlens-dicom"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{entry.name}.tmp-{secrets.token_hex(4)}"
    try:
        result = convert_series(series, tmp)
        manifest = {
            "format": FORMAT_VERSION,
            "folder": str(folder.resolve()),
            "series": series.uid,
            "kind": series.kind,
            "sources": prints,
            "files": {
                name: (getattr(result, name).name if getattr(result, name) is not None else None)
                for name in ("nifti", "bval", "bvec", "sidecar")
            },
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        target = entry if cache_enabled() else root / f"{entry.name}-{secrets.token_hex(4)}"
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)  # a stale entry of this series
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log.info("DICOM series %s of %s converted into %s", series.label, folder, target)
    loaded = _load_entry(target, series)
    assert loaded is not None
    return loaded


def resolve(folder: str | os.PathLike, *, kind: str | None, series: str | None = None) -> ConvertedSeries:
    """The one series of a DICOM folder a command needs (``kind`` "dwi" for a diffusion input,
    None for an image), converted. Several candidates: :class:`~.dicom_series.SeveralSeries`."""
    folder = Path(folder)
    listed = list_series(folder)
    chosen = choose(listed, series, folder, kind=kind if series is None and len(listed) > 1 else None)
    return converted(folder, chosen)


def layer_sources(folder: str | os.PathLike, series: str | None = None) -> list[ConvertedSeries]:
    """What the window opens from a DICOM folder, converted: the diffusion series (``series``
    chooses among several, else :class:`SeveralSeries`) and every image series; with ``series``
    naming an image series, only that one."""
    folder = Path(folder)
    listed = list_series(folder)
    if series is not None:
        chosen = choose(listed, series, folder)
        wanted = (
            [chosen, *(s for s in listed if s.kind == "anat" and s is not chosen)] if chosen.kind == "dwi" else [chosen]
        )
    else:
        if sum(s.kind == "dwi" for s in listed) > 1:
            choose(listed, None, folder, kind="dwi")  # raises, listing them
        wanted = listed
    return [converted(folder, s) for s in wanted]


def dicom_input(path: str | os.PathLike, *, kind: str | None) -> ConvertedSeries | None:
    """The hook of the NIfTI readers: a DICOM folder given where a file is expected, as the one
    converted series it holds (``kind`` "dwi" picks the diffusion series among others); None
    for anything that is not a DICOM folder."""

    if not is_dicom_folder(path):
        return None
    return resolve(path, kind=kind)


# --- import into a folder ----------------------------------------------------------------------


def subject_label(series: list[DicomSeries], subject: str | None = None, *, deidentify: bool = False) -> str:
    """The BIDS subject label (without ``sub-``) of an import: ``subject`` when given (letters
    and digits only), else ``01`` when de-identified, else the patient ID reduced to letters and
    digits, else ``01``. Series of several patients without ``subject`` (de-identified or not):
    :class:`InputError`; with ``subject``, they are imported as that one subject, with a warning
    naming the patient IDs (one patient under two IDs, e.g. two sites', is the use)."""
    folder = series[0].files[0].parent if series and series[0].files else None
    labels = sorted({re.sub(r"[^A-Za-z0-9]", "", s.patient_id) for s in series} - {""})
    if subject is not None:
        label = str(subject).strip().removeprefix("sub-")
        if not label or not label.isascii() or not label.isalnum():
            raise InputError(
                f"--subject {subject!r} is not a BIDS subject label",
                path=folder,
                fix="Give letters and digits only, e.g. --subject 042 or --subject P042",
            )
        if len(labels) > 1:
            log.warning(
                "the series belong to %d patient IDs (%s); all are imported as sub-%s, as --subject asks: check "
                "that they are one patient",
                len(labels), ", ".join(labels), label,
            )  # fmt: skip
        return label
    if len(labels) > 1:
        raise InputError(
            f"the series belong to several patients (IDs {', '.join(labels)})",
            path=folder,
            fix="Import one patient at a time (--series NUMBER), or name the subject with --subject LABEL",
        )
    if deidentify:
        return DEFAULT_SUBJECT
    return labels[0] if labels else DEFAULT_SUBJECT


def bids_name(series: DicomSeries, kind: str, taken: set[str], subject: str = DEFAULT_SUBJECT) -> tuple[str, str]:
    """(folder, file stem) for a converted series: ``sub-01/dwi``/``sub-01_dwi``,
    ``sub-01/anat``/``sub-01_T1w``…"""
    entity = f"sub-{subject}"
    if kind == "dwi":
        datatype, stem = "dwi", f"{entity}_dwi"
    else:
        datatype = "anat"
        text = f"{series.description}"
        suffix = next((name for pattern, name in BIDS_SUFFIX if pattern.search(text)), None)
        if suffix is None:
            acq = re.sub(r"[^A-Za-z0-9]", "", series.description) or f"series{series.number or 0}"
            stem = f"{entity}_acq-{acq}_MR"
        else:
            stem = f"{entity}_{suffix}"
    if f"{datatype}/{stem}" in taken:
        entity, _, rest = stem.rpartition("_")
        run = 2
        while f"{datatype}/{entity}_run-{run}_{rest}" in taken:
            run += 1
        stem = f"{entity}_run-{run}_{rest}"
    taken.add(f"{datatype}/{stem}")
    return f"sub-{subject}/{datatype}", stem


def import_dicom(
    folder: str | os.PathLike,
    outdir: str | os.PathLike,
    *,
    series: str | None = None,
    subject: str | None = None,
    deidentify: bool = False,
    progress=None,
    cancelled=None,
) -> list[ConvertedSeries]:
    """Convert the series of ``folder`` into ``outdir`` with BIDS names: every image series, and
    the one diffusion series (``series`` chooses among several: :class:`SeveralSeries` if not
    given). With ``series`` naming an image series, only that one. ``subject`` and
    ``deidentify``: see :func:`subject_label`. Nothing is written unless all convert."""
    folder, outdir = Path(folder), Path(outdir)
    listed = list_series(folder)
    if series is not None:
        wanted = [choose(listed, series, folder)]
    else:
        dwi = [s for s in listed if s.kind == "dwi"]
        if len(dwi) > 1:
            choose(listed, None, folder, kind="dwi")  # raises, listing them
        wanted = listed
    label = subject_label(wanted, subject, deidentify=deidentify)
    outdir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".import-dicom-", dir=outdir))
    results, taken = [], set()
    try:
        for i, s in enumerate(wanted):
            if cancelled is not None and cancelled():
                raise Cancelled()
            converted_here = convert_series(s, staging / f"{i:03d}", deidentify=deidentify)
            datatype, stem = bids_name(s, converted_here.kind, taken, label)
            results.append((converted_here, datatype, stem))
            if progress is not None:
                progress(i + 1, len(wanted))
        clashes = [outdir / d / f"{stem}.nii.gz" for _, d, stem in results if (outdir / d / f"{stem}.nii.gz").exists()]
        if clashes:
            raise InputError(
                f"{clashes[0]} exists already",
                path=outdir,
                fix="Give an empty output folder (-o), or move the earlier import away",
            )
        placed = []
        for conv, datatype, stem in results:
            (outdir / datatype).mkdir(parents=True, exist_ok=True)
            moved = {}
            for name in ("nifti", "bval", "bvec", "sidecar"):
                source = getattr(conv, name)
                if source is None:
                    moved[name] = None
                    continue
                ext = ".nii.gz" if name == "nifti" else source.suffix
                moved[name] = outdir / datatype / f"{stem}{ext}"
                os.replace(source, moved[name])
            placed.append(ConvertedSeries(conv.series, **moved))
        return placed
    finally:
        shutil.rmtree(staging, ignore_errors=True)
