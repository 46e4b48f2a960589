"""What the planning report says, in words a surgeon files: patient, study and scan fields, the
parameters of every result, the statistics and the distances; testable without a window.

The patient and scan fields come from the JSON sidecar dcm2niix writes beside a NIfTI converted
from DICOM (BIDS keys: ``PatientName``, ``PatientID``, ``PatientBirthDate``,
``AcquisitionDateTime`` or ``StudyDate``, ``SeriesDescription``, ``ProtocolName``,
``Manufacturer``, ``ManufacturersModelName``, ``MagneticFieldStrength``) when there is one; the
user edits them before the report is written, and they are kept in the session. Parameters are
printed in words ("step 0.5 mm", "stop below FA 0.15"); internal keys (timings, batches, device
choices) are never printed, nor "inf" or "nan" ("not reached", "none").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from .window_units import CHOICE_WORDS, cosine_to_degrees
from .window_words import compute_device

#: Numbered choices by name (:data:`app.window_units.CHOICE_WORDS`), by provenance key.
_CHOICES = {name: words for (_params, name), words in CHOICE_WORDS.items()}

#: The report's patient and scan fields: (attribute, label) in the order printed.
FIELD_LABELS = (
    ("patient_name", "Patient"),
    ("patient_id", "Patient ID"),
    ("birth_date", "Date of birth"),
    ("study_date", "Study date"),
    ("series", "Series"),
    ("protocol", "Protocol"),
    ("scanner", "Scanner"),
    ("field_strength", "Field strength"),
)


@dataclass
class ScanInfo:
    """Patient, study and scan fields (empty when unknown)."""

    patient_name: str = ""
    patient_id: str = ""
    birth_date: str = ""
    study_date: str = ""
    series: str = ""
    protocol: str = ""
    scanner: str = ""
    field_strength: str = ""
    source: str = ""  # the sidecar they were read from

    def as_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict) -> ScanInfo:
        names = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in (values or {}).items() if k in names and v is not None})

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) of every field, "not given" for the empty ones."""
        return [(label, getattr(self, name) or "not given") for name, label in FIELD_LABELS]


def _date(text: str) -> str:
    """A DICOM date (YYYYMMDD) or BIDS date-time as YYYY-MM-DD (other text as it is)."""
    text = str(text).strip()
    if len(text) >= 8 and text[:8].isdigit():
        return f"{text[:4]}-{text[4:6]}-{text[6:8]}"
    return text[:10] if len(text) >= 10 and text[4] == "-" else text


def sidecar_path(nifti: str | Path) -> Path | None:
    """The JSON sidecar beside a NIfTI (``NAME.json`` for ``NAME.nii.gz``), or None."""
    path = Path(nifti)
    stem = path.name[: -len(".nii.gz")] if path.name.endswith(".nii.gz") else path.stem
    candidate = path.with_name(stem + ".json")
    return candidate if candidate.is_file() else None


def scan_info_from_sidecar(sidecar: dict, source: str = "") -> ScanInfo:
    """The report's fields from a dcm2niix/BIDS sidecar's keys."""
    get = lambda key: str(sidecar.get(key, "") or "").strip()  # noqa: E731
    name = get("PatientName").replace("^", " ").strip()
    study = get("AcquisitionDateTime") or get("StudyDate") or get("AcquisitionDate") or get("SeriesDate")
    scanner = " ".join(part for part in (get("Manufacturer"), get("ManufacturersModelName")) if part)
    strength = sidecar.get("MagneticFieldStrength")
    try:
        strength_text = f"{float(strength):g} T" if strength not in (None, "") else ""
    except (TypeError, ValueError):
        strength_text = str(strength)
    return ScanInfo(
        patient_name=name,
        patient_id=get("PatientID"),
        birth_date=_date(get("PatientBirthDate")),
        study_date=_date(study),
        series=get("SeriesDescription"),
        protocol=get("ProtocolName"),
        scanner=scanner,
        field_strength=strength_text,
        source=source,
    )


def read_scan_info(nifti: str | Path) -> ScanInfo | None:
    """The fields from the sidecar beside ``nifti``; None without one (or an unreadable one)."""
    path = sidecar_path(nifti)
    if path is None:
        return None
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return scan_info_from_sidecar(sidecar, str(path)) if isinstance(sidecar, dict) else None


def document_scan_info(document) -> ScanInfo:
    """The fields of the first layer loaded from a file with a sidecar (empty fields otherwise)."""
    for layer in document.layers:
        source = layer.provenance.get("file") if isinstance(layer.provenance, dict) else None
        dicom = layer.provenance.get("dicom") if isinstance(layer.provenance, dict) else None
        if isinstance(dicom, dict) and dicom.get("nifti"):
            source = dicom["nifti"]  # converted from a DICOM folder: dcm2niix's sidecar is beside it
        if source:
            info = read_scan_info(source)
            if info is not None:
                return info
    return ScanInfo()


# ------------------------------------------------------------------------ values in words


def value_text(value) -> str:
    """A value as a report prints it: no "inf" ("not reached"), no "nan"/None ("none")."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "none"
        if math.isinf(value):
            return "not reached"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        shown = ", ".join(value_text(v) for v in value[:8])
        return shown + (f", … ({len(value)} values)" if len(value) > 8 else "")
    return str(value)


#: Parameter keys in words: key -> (words before the value, unit after it).
WORDS = {
    "step_mm": ("step", "mm"),
    "step_vox": ("step", "voxels"),
    "steplength": ("step", "mm"),
    "fa_threshold": ("stop below FA", ""),
    "max_angle_deg": ("maximum turn", "° per step"),
    "max_angle": ("maximum turn", "° per step"),
    "min_length_mm": ("shortest kept", "mm"),
    "max_length_mm": ("longest", "mm"),
    "integrator": ("integration", ""),
    "method": ("method", ""),
    "seeds_per_voxel": ("seeds per voxel", ""),
    "seed_placement": ("seed placement", ""),
    "rng_seed": ("random seed", ""),
    "seeds": ("seeds", ""),
    "streamlines": ("streamlines", ""),
    "margin_mm": ("safety margin", "mm"),
    "lambda": ("regularisation λ", ""),
    "max_iter": ("at most", "iterations"),
    "nsamples": ("samples per seed", ""),
    "radius_mm": ("end-point search radius", "mm"),
    "weight": ("matrix of", ""),
    "lesion": ("lesion", ""),
    "backend": ("computed on", ""),
    "voxels_fitted": ("voxels fitted", ""),
    "volumes": ("diffusion volumes", ""),
    "mask": ("mask", ""),
    # probabilistic (probtrackx's names) and COMMIT's, in words
    "fibthresh": ("ignore sticks with a volume fraction below", ""),
    "randfib": ("first step's stick", ""),
    "fibst": ("first stick", ""),
    "nsteps": ("at most", "steps"),
    "loopcheck": ("loop check", ""),
    "modeuler": ("modified Euler integration", ""),
    "lipschitz": ("FISTA step (Lipschitz constant)", ""),
    "min_fa": ("stop below FA", ""),
    "curvature_threshold": ("curvature threshold (cosine)", ""),
    "tol": ("convergence tolerance", ""),
    "iterations": ("iterations", ""),
    "reached_target": ("reached the target", "streamlines"),
    "fibers": ("streamlines", ""),
    "steps": ("tracking steps", ""),
    "streamlines_removed_by_rois": ("removed by the ROIs", "streamlines"),
    "directions": ("directions per seed point", ""),
    "top_percent": ("shown: top", "%"),
    "shown_top_percent": ("shown: top", "%"),
}

#: Keys that are bookkeeping, not a parameter the reader can act on: never printed.
INTERNAL = {
    "batches",
    "device_choice",
    "points",
    "first_batch_s",
    "seeds_per_s",
    "stop_reasons",
    "tensor",
    "device",
    # how the arrays were computed, and summaries the maps themselves show: not settings
    "engine",
    "precision",
    "min_signal",
    "voxels",
    "fa_mean",
    "md_mean",
    "stored_as",
    "flags",
}
INTERNAL |= {"scanner_affine"}  # an image placed by a registration: where the scanner had put it


def _internal(key: str) -> bool:
    return key in INTERNAL or key.endswith("_s") or key.startswith("_")


def parameters_in_words(provenance: dict) -> list[str]:
    """A result's provenance as short phrases ("step 0.5 mm", "stop below FA 0.15"…): parameters
    first, then counts; internal keys (timings, batches, device choices) left out."""
    return [
        f"{words} {value}" if words not in ("", "made by") else value for words, value in parameter_rows(provenance)
    ]


def parameter_rows(provenance: dict) -> list[tuple[str, str]]:
    """A result's provenance as (setting in words, value with its unit) rows, for the report's
    table: ``("step", "0.5 mm")``; the method first (``("made by", "deterministic tracking")``)."""
    if not isinstance(provenance, dict):
        return []
    out: list[tuple[str, str]] = []
    flat: dict = {}
    for key, value in provenance.items():
        if isinstance(value, dict) and key in ("parameters", "params"):
            flat.update(value)
        elif key not in ("parameters", "params"):
            flat[key] = value
    for key, value in flat.items():
        if key == "dicom_export" and isinstance(value, dict):
            out.append(("", export_in_words(value)))
            continue
        if key == "registration" and isinstance(value, dict):  # app.anatomy_layers.registration_record
            named = f" {value['id']}" if value.get("id") else ""
            out.insert(0, (f"placed by registration{named}", str(value.get("describe", value.get("kind", "")))))
            continue
        if _internal(key) or isinstance(value, dict) or value is None or value in ("", [], ()):
            continue
        if key == "file":
            out.append(("file", Path(str(value)).name))
            continue
        if key == "computed":
            out.insert(0, ("made by", str(value)))
            continue
        if key == "cthr" and isinstance(value, int | float):  # a cosine: in degrees, as the window edits it
            out.append(("max angle", f"{cosine_to_degrees(value):.1f}° (probtrackx curvature threshold {value:g})"))
            continue
        if key == "backend":
            out.append(("computed on", compute_device(flat)))
            continue
        words, unit = WORDS.get(key, (key.replace("_", " "), ""))
        named = _CHOICES.get(key, {})
        if isinstance(value, int) and not isinstance(value, bool) and value in named:  # by name, as the window
            out.append((words, named[value]))
            continue
        if key.endswith("_mm") and not unit:
            words, unit = words.removesuffix(" mm"), "mm"
        text = value_text(value)
        if text == "not reached" and key.startswith("max"):
            text = "none (no limit)"
        if unit and (text[:1].isdigit() or text[:1] == "-"):
            text += unit if unit.startswith("°") else f" {unit}"
        out.append((words, text))
    return out


def export_in_words(export: dict) -> str:
    """What an export for navigation wrote (:meth:`app.io.dicom_export.ExportResult.as_dict`), in
    one phrase: "exported for navigation as SEG, RTSTRUCT, overlay on "T1w" (de-identified) to …"."""
    kinds = ", ".join(kind.upper() if kind != "overlay" else "coloured series" for kind in export.get("files", {}))
    reference = export.get("reference", {}).get("series_description") or "the reference series"
    text = f'exported for navigation as {kinds or "nothing"} on "{reference}"'
    if export.get("deidentified"):
        text += " (de-identified)"
    return text + f" to {export.get('outdir', '')}"


# ------------------------------------------------------------------ exported for navigation

#: The objects of an export for navigation in words.
EXPORT_KINDS = {
    "seg": "Segmentation (SEG)",
    "rtstruct": "RT Structure Set (RTSTRUCT)",
    "overlay": "coloured series (overlay, not for diagnosis)",
}


def navigation_exports(document) -> list[dict]:
    """Every export for navigation recorded on the document's layers (each bundle keeps the
    :meth:`app.io.dicom_export.ExportResult.as_dict` of its latest one), each export once."""
    seen, out = set(), []
    for layer in document.layers:
        export = layer.provenance.get("dicom_export") if isinstance(layer.provenance, dict) else None
        if not isinstance(export, dict):
            continue
        key = (export.get("outdir"), tuple(o.get("series_instance_uid") for o in export.get("objects", [])))
        if key not in seen:
            seen.add(key)
            out.append(export)
    return out


def export_summary(export: dict) -> str:
    """One line on an export: the reference series (description and UID), de-identified or not,
    the dilation and the folder."""
    reference = export.get("reference", {})
    description = reference.get("series_description") or "no description"
    identified = "yes (patient identifiers removed)" if export.get("deidentified") else "no (patient identifiers kept)"
    dilation = export.get("dilate_mm")
    dilation_text = "not recorded" if dilation is None else f"{float(dilation):g} mm"
    return (
        f'Onto the reference series "{description}" (series UID {reference.get("series_instance_uid") or "unknown"})'
        f" · de-identified: {identified} · dilation {dilation_text} · in {export.get('outdir', '')}"
    )


def export_rows(export: dict) -> list[list[str]]:
    """A row per object written: kind, file (relative to the export folder), series instance UID,
    SOP instance UID (the first and last, with the count, for a series of images)."""
    outdir = Path(str(export.get("outdir", "")))
    rows = []
    objects = export.get("objects") or [
        {"kind": kind, "file": files[0] if len(files) == 1 else str(Path(files[0]).parent), "instances": len(files)}
        for kind, files in export.get("files", {}).items()
        if files
    ]  # exports recorded before the UIDs were
    for obj in objects:
        path = Path(str(obj.get("file", "")))
        try:
            shown = str(path.relative_to(outdir))
        except ValueError:
            shown = str(path)
        if obj.get("instances", 1) > 1:
            shown += f"/ ({obj['instances']} files)"
        sops = obj.get("sop_instance_uids") or []
        sop_text = sops[0] if len(sops) == 1 else f"{len(sops)} instances: {sops[0]} … {sops[-1]}" if sops else ""
        rows.append([
            EXPORT_KINDS.get(obj.get("kind"), str(obj.get("kind"))),
            shown,
            obj.get("series_instance_uid") or "not recorded",
            sop_text or "not recorded",
        ])  # fmt: skip
    return rows
