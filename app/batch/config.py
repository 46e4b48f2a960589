"""The parameters of a cohort run: a TOML file with one table per step, keyed by the flag names.

.. code-block:: toml

    [track-deterministic]
    fa-threshold = 0.2
    seeds-per-voxel = 2

    [connectome]
    labels = "atlas/sub-{subject}_space-dwi_dseg.nii.gz"   # per subject: {subject}, {session}
    lut = "atlas/lut.tsv"

Keys are the single-subject command's flags without the dashes (the parameter dataclasses'
flags, the per-subject file options, ``device``); an unknown key is an error that lists the
valid ones, and values are checked by the dataclasses before any subject runs. File options
may name ``{subject}`` and ``{session}``; relative paths are relative to the config file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import InputError
from .dataset import Series
from .steps import STEPS, option_action, options_argv, step_parameters

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib


def load_config(path: str | Path | None, steps: list[str]) -> dict[str, dict]:
    """``{step: {key: value}}`` from the TOML file (empty tables without one), validated.
    Tables of steps not in this run are allowed (one file serves several runs) but checked too."""
    if path is None:
        return {name: {} for name in steps}
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the config ({exc.strerror or exc})", path=path,
                         fix="Give a readable TOML file to --config") from None  # fmt: skip
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML ({exc})", path=path, fix="Check the file's syntax") from None
    unknown = [name for name in data if name not in STEPS]
    if unknown:
        raise InputError(
            f"unknown step table [{'], ['.join(unknown)}]",
            path=path,
            fix=f"Tables are steps: {', '.join(STEPS)}",
        )
    config = {name: {} for name in steps}
    for name, table in data.items():
        if not isinstance(table, dict):
            raise InputError(
                f"{name} must be a table, not a value", path=path, fix=f"Write [{name}] and its options below it"
            )
        base = Path(os.path.abspath(path.parent))
        config[name] = {key: _resolve(name, key, value, base, path) for key, value in table.items()}
        _check_keys(name, config[name], path)
        _check_values(name, config[name], path)
    return config


def _resolve(name: str, key: str, value, base: Path, path: Path):
    """File options as absolute, normalised paths, relative ones taken from the config file's folder
    (so that the same file reached another way is the same input to the next run's skip test);
    templates stay templates, checked to fill in."""
    if key in STEPS[name].file_keys and key != "peaks-frame":
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise InputError(
                f"[{name}] {key} must be a path",
                path=path,
                fix='Give a string (or a list of them), e.g. "masks/sub-{subject}_seed.nii.gz"',
            )
        for v in values:
            try:
                v.format(subject="01", session="01")
            except (KeyError, IndexError, ValueError) as exc:
                raise InputError(f"[{name}] {key} cannot be filled in: {v!r} ({exc})", path=path,
                                 fix="Use only {subject} and {session} in braces") from None  # fmt: skip
        resolved = [os.path.normpath(v if Path(v).is_absolute() else base / v) for v in values]
        return resolved if isinstance(value, list) else resolved[0]
    return value


def _check_keys(name: str, table: dict, path: Path) -> None:
    valid = STEPS[name].config_keys
    unknown = [key for key in table if key not in valid]
    if unknown:
        raise InputError(
            f"[{name}] has no option {', '.join(unknown)}",
            path=path,
            fix=f"The options of {name} are: {', '.join(valid)}",
        )


def _check_values(name: str, table: dict, path: Path) -> None:
    """Each value through the command's own parser and dataclasses, with placeholder paths."""

    for key, value in table.items():
        action = option_action(name, key) if key != "device" else None
        if action is not None and action.nargs == 0 and not isinstance(value, bool):
            raise InputError(
                f"[{name}] {key} is a switch, not {value!r}", path=path, fix=f"Write {key} = true (or false)"
            )
    try:
        words = options_argv(name, {k: v for k, v in table.items() if k != "device"})
        step_parameters(name, [*STEPS[name].command, *_placeholders(name), *words, "-o", "out"])
    except InputError as exc:
        raise InputError(f"[{name}]: {exc.problem}", path=path, fix=exc.fix) from None
    device = table.get("device")
    if device is not None and device not in ("auto", "cpu", "gpu"):
        raise InputError(f"[{name}] device {device!r} is not a device", path=path, fix="Write auto, cpu or gpu")


def _placeholders(name: str) -> list[str]:
    """Stand-in inputs so a step's parser accepts the line (only the parameters are read)."""
    return {
        "fit-dti": ["dwi.nii.gz"],
        "fit-ballstick": ["dwi.nii.gz"],
        "track-deterministic": ["--tensor", "t.nii.gz", "--whole-brain"],
        "track-probabilistic": ["--samples", "s", "--seed", "m.nii.gz"],
        "commit": ["--dwi", "d.nii.gz", "--tractogram", "t.trx"],
        "connectome": ["t.trx", "--labels", "l.nii.gz"],
        "profile": ["t.trx", "--map", "m.nii.gz"],
        "register": ["dwi.nii.gz", "mni"],
        "bundles": ["--samples", "s", "--registration", "r"],
        "profiles": ["--bundles", "b", "--map", "FA=m.nii.gz"],
    }[name]


def subject_options(options: dict, name: str, series: Series) -> dict:
    """A step's options for one subject: ``{subject}``/``{session}`` filled in the file options."""
    fields = {"subject": series.subject, "session": series.session or ""}

    def fill(value):
        try:
            return value.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise InputError(
                f"[{name}] cannot fill in {value!r} ({exc})", fix="Use only {subject} and {session} in braces"
            ) from None

    out = {}
    for key, value in options.items():
        if key in STEPS[name].file_keys and key != "peaks-frame":
            out[key] = [fill(v) for v in value] if isinstance(value, list) else fill(value)
        else:
            out[key] = value
    return out
