"""The subjects of a BIDS dataset: each DWI series with its gradient files, through pybids.

pybids (the BIDS reference library) is used rather than a walk of ``sub-*/[ses-*/]dwi``
because it applies the inheritance principle (a ``dwi.bval`` at the dataset's top level
serves every subject), knows the entities and their order, and reads derivatives too. It is
imported here only (0.2-0.4 s) and indexes 300 subjects in about 3 s on 2 busy cores without
validation (``validate=False``: a dataset that the validator would question still runs; a
series missing its gradients is reported per subject).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..io.dwi import find_gradient_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Series:
    """One DWI series of a subject (and session): the image and its FSL gradient files."""

    subject: str
    session: str | None
    dwi: Path
    bval: Path | None
    bvec: Path | None

    @property
    def name(self) -> str:
        return f"sub-{self.subject}" + (f"_ses-{self.session}" if self.session else "")


def _layout(bids_dir: Path):
    try:
        from bids import BIDSLayout
    except ImportError as exc:
        raise InputError(
            f"pybids is not installed ({exc})", fix="Install the cohort extra: pip install 'tractlens[batch]'"
        ) from None
    if not (bids_dir / "dataset_description.json").is_file():
        raise InputError(
            "not a BIDS dataset (no dataset_description.json at its top level)",
            path=bids_dir,
            fix="Give the dataset's top folder, the one holding dataset_description.json and the sub-* folders",
        )
    try:
        return BIDSLayout(str(bids_dir), validate=False, derivatives=False)
    except Exception as exc:  # pybids raises its own types (BIDSValidationError, ValueError, ...)
        raise InputError(f"pybids cannot read this dataset: {exc}", path=bids_dir,
                         fix="Check the dataset with the BIDS validator") from None  # fmt: skip


def _strip(labels: list[str] | None, entity: str) -> list[str] | None:
    """Labels as BIDS apps take them: ``01`` or ``sub-01`` alike."""
    if not labels:
        return None
    return [label.removeprefix(f"{entity}-") for label in labels]


def find_series(
    bids_dir: str | Path,
    participant_labels: list[str] | None = None,
    session_labels: list[str] | None = None,
) -> list[Series]:
    """Every DWI series (``sub-*/[ses-*/]dwi/*_dwi.nii[.gz]``) of the chosen participants and
    sessions, sorted by subject and session. A label asked for but absent is an error naming
    the labels there are. The dataset's folder is taken with its real path, so the inputs the
    sidecars record are the same however the folder was named (``..``, a link, the current folder)."""
    bids_dir = Path(bids_dir).resolve()
    layout = _layout(bids_dir)
    participants = _strip(participant_labels, "sub")
    sessions = _strip(session_labels, "ses")
    known = set(layout.get_subjects())
    _refuse_unknown(participants, known, "participant", "sub", bids_dir)
    _refuse_unknown(sessions, set(layout.get_sessions()) if sessions else set(), "session", "ses", bids_dir)
    query = {"suffix": "dwi", "extension": [".nii.gz", ".nii"], "datatype": "dwi"}
    if participants:
        query["subject"] = participants
    if sessions:
        query["session"] = sessions
    found = []
    for image in layout.get(**query):
        entities = image.get_entities()
        bval, bvec = find_gradient_files(Path(image.path))  # the pairs the fit itself would read
        found.append(
            Series(
                subject=entities["subject"],
                session=entities.get("session"),
                dwi=Path(image.path),
                bval=bval or _gradient(layout, image.path, "get_bval"),
                bvec=bvec or _gradient(layout, image.path, "get_bvec"),
            )
        )
    without = sorted(set(participants or known) - {series.subject for series in found})
    where = " in the chosen sessions" if sessions else ""
    if found and without and participants:  # asked for by name: refused
        raise InputError(
            f"participant {', '.join(without)} has no DWI series (sub-*/[ses-*/]dwi/*_dwi.nii.gz){where}",
            path=bids_dir,
            fix="Leave them out of --participant-label, or check their dwi folders",
        )
    if found and without:  # the whole dataset: said, not left out in silence
        log.warning("%d participant(s) without a DWI series%s left out: %s", len(without), where,
                    ", ".join(f"sub-{label}" for label in without[:10]) + (", ..." if len(without) > 10 else ""))  # fmt: skip
    if not found:
        raise InputError(
            "no DWI series found (sub-*/[ses-*/]dwi/*_dwi.nii.gz)"
            + (" for the chosen participants and sessions" if participants or sessions else ""),
            path=bids_dir,
            fix="Check --participant-label/--session-label, or the dataset's layout",
        )
    _refuse_duplicates(found)
    return sorted(found, key=lambda s: (s.subject, s.session or ""))


def _refuse_unknown(asked: list[str] | None, known: set[str], what: str, entity: str, bids_dir: Path) -> None:
    """A label asked for that the dataset lacks: refused, naming those there are."""
    missing = sorted(set(asked or ()) - known)
    if missing:
        raise InputError(
            f"no {what} {', '.join(missing)} in this dataset",
            path=bids_dir,
            fix=f"Choose among: {', '.join(sorted(known)) or f'none (no {entity}-* folders)'}",
        )


def _gradient(layout, path: str, getter: str) -> Path | None:
    """The series' own ``.bval``/``.bvec`` beside it; else pybids' inheritance lookup (a
    dataset-level file), which costs ~50 ms a query: 300 subjects would wait half a minute."""
    beside = Path(path.removesuffix(".gz").removesuffix(".nii") + (".bval" if getter == "get_bval" else ".bvec"))
    if beside.is_file():
        return beside
    try:
        found = getattr(layout, getter)(path)
    except Exception:  # none found: pybids raises; the fit then names what is missing
        return None
    return Path(found) if found else None


def _refuse_duplicates(found: list[Series]) -> None:
    """Two series of one subject and session (runs, acquisitions) would write the same
    derivatives: refused with the files named, until runs are supported."""
    seen: dict[tuple[str, str | None], Path] = {}
    for series in found:
        key = (series.subject, series.session)
        if key in seen:
            raise InputError(
                f"{series.name} has more than one DWI series ({seen[key].name}, {series.dwi.name}); "
                "a cohort run takes one per subject and session",
                path=series.dwi.parent,
                fix="Leave out the extra runs (or give --session-label) and run them separately",
            )
        seen[key] = series.dwi
