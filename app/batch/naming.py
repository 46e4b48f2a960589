"""BIDS-derivatives names of the outputs and the derivatives folder's ``dataset_description.json``.

Names follow the BIDS derivatives conventions (and the diffusion derivatives proposal, BEP016,
for model parameter maps): ``sub-<label>[_ses-<label>]_space-dwi_model-tensor_param-fa_dwimap.nii.gz``,
``..._desc-deterministic_tractography.trx``. Each output has a JSON sidecar of the same name
(``.json`` in place of the extension; for a folder, the folder's name + ``.json``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import __version__
from ..errors import InputError
from ..io._atomic import write_text_atomic
from ..io.outputs import check_output_folder

_EXTENSIONS = (".nii.gz", ".nii", ".trx", ".trk", ".tck", ".csv", ".txt", ".tsv", ".npy", ".json")


def entity_prefix(subject: str, session: str | None) -> str:
    """``sub-01`` or ``sub-01_ses-pre``."""
    return f"sub-{subject}" + (f"_ses-{session}" if session else "")


def subject_folder(derivatives: Path, subject: str, session: str | None) -> Path:
    """``DERIV/sub-01/[ses-pre/]dwi``: where a subject's outputs go."""
    folder = derivatives / f"sub-{subject}"
    if session:
        folder /= f"ses-{session}"
    return folder / "dwi"


def sidecar_of(path: Path) -> Path:
    """The JSON sidecar of an output: its name with the extension replaced by ``.json``."""
    name = path.name
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            return path.with_name(name[: -len(ext)] + ".json")
    return path.with_name(name + ".json")  # a folder (bedpostX, probtrackx)


def alphanumeric(text: str) -> str:
    """A BIDS label: letters and digits only (``fit_RMSE`` → ``fitrmse``)."""
    return "".join(c for c in text.lower() if c.isalnum())


def container() -> dict | None:
    """The container the run is in, when it can be told (Docker, Apptainer/Singularity)."""
    if os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER"):
        image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
        return {"Type": "singularity", "URI": image}
    if Path("/.dockerenv").exists():
        return {"Type": "docker"}
    return None


def check_derivatives(derivatives: Path, bids_dir: Path) -> Path:
    """The derivatives folder of a run, refused before any work when it is the source dataset, or
    another raw BIDS dataset (its description would become a derivative's and its subjects' folders
    would fill with maps), or cannot be written."""
    derivatives = Path(derivatives).resolve()
    if derivatives == Path(bids_dir).resolve():
        raise InputError(
            "is the BIDS dataset itself; its derivatives go in a folder of their own",
            path=derivatives,
            fix=f"Give e.g. -o {derivatives / 'derivatives' / 'tractlens'}",
        )
    description = derivatives / "dataset_description.json"
    if description.is_file():
        try:
            kind = json.loads(description.read_text()).get("DatasetType", "raw")
        except (OSError, ValueError, AttributeError):
            kind = "derivative"  # an unreadable description is replaced (write_dataset_description)
        if kind != "derivative":
            raise InputError(
                f"is a raw BIDS dataset (its dataset_description.json says DatasetType {kind!r}), not a "
                "derivatives folder",
                path=derivatives,
                fix="Give a new folder, or a derivatives folder, for -o",
            )
    return check_output_folder(derivatives, "derivatives folder")


def write_dataset_description(derivatives: Path, bids_dir: Path, command: list[str]) -> Path:
    """``dataset_description.json`` of the derivatives, with ``GeneratedBy`` (name, version,
    command, container) and the source dataset; an existing one keeps its other fields and
    gains this run's ``GeneratedBy`` entry if it is not there yet."""
    path = derivatives / "dataset_description.json"
    generated = {
        "Name": "tractlens",
        "Version": __version__,
        "Description": " ".join(command),
        "CodeURL": "https://pypi.org/project/tractlens/",
    }
    if (found := container()) is not None:
        generated["Container"] = found
    description = {
        "Name": "TractLens derivatives",
        "BIDSVersion": "1.9.0",
        "DatasetType": "derivative",
        "GeneratedBy": [],
        "SourceDatasets": [{"URL": bids_dir.resolve().as_uri()}],
    }
    if path.exists():
        try:
            description = {**description, **json.loads(path.read_text())}
        except (OSError, ValueError):
            pass  # an unreadable description is replaced
    entries = [g for g in description.get("GeneratedBy", []) if g.get("Name") != "tractlens"]
    description["GeneratedBy"] = [*entries, generated]
    derivatives.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(description, indent=2), path)
    return path


def command_line() -> list[str]:
    """The command as typed (for ``GeneratedBy`` and the sidecars)."""
    return [Path(sys.argv[0]).name, *sys.argv[1:]]
