"""The steps of a cohort run: the single-subject commands, their inputs, outputs and names.

A step is one ``tractlens`` subcommand (:class:`StepSpec`): the command words, the parameter
dataclasses whose flags a config file may set, the per-subject files it may be given
(``seed``, ``labels``, ...), the earlier steps whose outputs it reads, and how the files it
writes are named in the derivatives. :func:`step_argv` builds a subject's command line
exactly as a user would type it, so a cohort's outputs are those of the single-subject
commands; :func:`step_parameters` reads the parameters back from that command line through
the same parser and dataclasses (the provenance, and the skip test).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tractlens.gpu.ballstick import BallStickParams
from tractlens.gpu.commit import CommitParams
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.dti import DTIFitParams
from tractlens.gpu.probabilistic_params import ProbParams

from ..cli.options import params_from_args
from ..cli.parameter_flags import cli_flags
from ..cli.parser import build_command_parser
from ..errors import InputError
from ..params import (
    ConnectomeParams,
    ProbOutputParams,
    ProfileParams,
    ProfileTableParams,
    RegisterParams,
    SeedingParams,
    TractogramOutputParams,
)
from ..pipelines.dti import DTI_MAPS, DTI_PREFIX
from .dataset import Series
from .naming import alphanumeric

#: The placeholder for the output path (``-o``) in a step's command line: the task puts its
#: staging folder there.
OUTPUT = "{staging}"


@dataclass(frozen=True)
class StepSpec:
    """One step: a ``tractlens`` subcommand run per subject."""

    name: str
    command: tuple[str, ...]
    params: tuple[type, ...]
    file_keys: tuple[str, ...]  # per-subject file options a config may give (templates)
    needs: tuple[str, ...]  # steps whose outputs this one reads
    folder_output: bool  # -o is a folder whose files are renamed one by one
    #: ``(prefix, options) -> {key: derivative name}`` of the outputs later steps read (for a
    #: file-output step: the one file)
    primary: Callable[[str, dict], dict[str, str]]
    #: ``(native name, prefix, options) -> derivative name`` for the other files of a folder
    #: output (None: not kept, e.g. the command's own summary JSON, folded into the sidecars)
    rename: Callable[[str, str, dict], str | None] | None = None
    #: ``(series, inputs, options) -> argv`` after the command words, without ``-o``
    arguments: Callable[[Series, dict[str, Path], dict], list[str]] = lambda s, i, o: []
    #: A parser of the step's own for a step that is not a ``tractlens`` subcommand here (its
    #: ``func`` runs the step), and what of its parsed line the provenance keeps.
    parser: Callable[[], argparse.ArgumentParser] | None = None
    record: Callable[[argparse.Namespace], dict] | None = None
    #: config keys besides the dataclasses' flags and the file options
    extra_keys: tuple[str, ...] = ()

    @property
    def config_keys(self) -> tuple[str, ...]:
        """The keys a config's ``[step]`` table may hold: the dataclasses' flag names, the file
        options and ``device``."""
        keys = [flag.lstrip("-") for t in self.params for f in dataclasses.fields(t) for flag in cli_flags(t, f.name)]
        return (*keys, *self.extra_keys, *self.file_keys, "device")


#: fit-dti's maps (dtifit's names, ``dti_FA.nii.gz``...), each a ``param-`` of the tensor model
_TENSOR_MAPS = tuple(name.lower() for name in DTI_MAPS if name != "mask")


def _dti_primary(prefix: str, options: dict) -> dict[str, str]:
    names = {m: f"{prefix}_space-dwi_model-tensor_param-{m}_dwimap.nii.gz" for m in _TENSOR_MAPS}
    return {**names, "mask": f"{prefix}_space-dwi_desc-brain_mask.nii.gz"}


def _dti_rename(native: str, prefix: str, options: dict) -> str | None:
    if native.endswith(".json"):
        return None
    key = native.removesuffix(".nii.gz").removeprefix(f"{DTI_PREFIX}_").lower()
    return _dti_primary(prefix, options).get(key)


def _dwi_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = [str(series.dwi)]
    for flag, path in (("--bval", series.bval), ("--bvec", series.bvec)):
        if path is not None:
            argv += [flag, str(path)]
    return argv


def _tracking_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = ["--tensor", str(inputs["tensor"]), "--tensor-order", "fsl"]  # fit-dti writes FSL's order
    return argv if "seed" in options else [*argv, "--whole-brain"]


def _probabilistic_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = ["--samples", str(inputs["samples"])]
    if "seed" not in options:  # the whole brain: the fit's brain mask
        argv += ["--seed", str(inputs["samples"] / "nodif_brain_mask.nii.gz")]
    return argv


def _commit_primary(prefix: str, options: dict) -> dict[str, str]:
    return {
        "weights": f"{prefix}_space-dwi_desc-commit_weights.txt",
        "filtered": f"{prefix}_space-dwi_desc-commitfiltered_tractography.trx",
    }


def _commit_rename(native: str, prefix: str, options: dict) -> str | None:
    if native == "streamline_weights.txt":
        return _commit_primary(prefix, options)["weights"]
    if native.startswith("tractogram_filtered"):
        return _commit_primary(prefix, options)["filtered"]
    if native.endswith(".nii.gz"):
        return f"{prefix}_space-dwi_model-commit_param-{alphanumeric(native.removesuffix('.nii.gz'))}_dwimap.nii.gz"
    return None  # commit.json: folded into the sidecars


def _commit_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = ["--dwi", str(series.dwi), "--tractogram", str(inputs["tractogram"])]
    for flag, path in (("--bval", series.bval), ("--bvec", series.bvec)):
        if path is not None:
            argv += [flag, str(path)]
    return argv


def _connectome_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = [str(inputs["tractogram"])]
    if options.get("weight") == "commit" and "streamline-weights" not in options and "weights" in inputs:
        argv += ["--streamline-weights", str(inputs["weights"])]
    return argv


def _profile_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    argv = [str(inputs["tractogram"])]
    return argv if "map" in options else [*argv, "--map", str(inputs["fa"])]


#: The space of the MNI152 template the register step registers to (FSL's, as TemplateFlow names it).
MNI_SPACE = "MNI152NLin6Asym"

#: fit-dti's maps the profiles step profiles (pyAFQ's DTI scalars).
PROFILE_METRICS = ("FA", "MD", "AD", "RD")


def _register_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    # the DWI's mean b=0 onto the template; SyN unless the config chooses another type
    return [str(series.dwi), "mni", *([] if "type" in options else ["--type", "syn"])]


def _bundles_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    return ["--samples", str(inputs["samples"]), "--registration", str(inputs["registration"])]


def _profiles_arguments(series: Series, inputs: dict[str, Path], options: dict) -> list[str]:
    maps = [w for m in PROFILE_METRICS for w in ("--map", f"{m}={inputs[m.lower()]}")]
    table = [] if "subject" in options else ["--subject", f"sub-{series.subject}"]
    table += [] if "session" in options else ["--session", f"ses-{series.session}" if series.session else ""]
    return ["--bundles", str(inputs["bundles"]), *maps, *table]


def _bundles_parser() -> argparse.ArgumentParser:
    from .bundles_step import bundles_parser

    return bundles_parser()


def _bundles_record(args: argparse.Namespace) -> dict:
    from .bundles_step import bundles_record

    return bundles_record(args)


STEPS: dict[str, StepSpec] = {
    spec.name: spec
    for spec in (
        StepSpec("fit-dti", ("fit-dti",), (DTIFitParams,), ("mask",), (), True,
                 _dti_primary, _dti_rename, _dwi_arguments),
        StepSpec("fit-ballstick", ("fit-ballstick",), (BallStickParams,), ("mask",), (), False,
                 lambda p, o: {"samples": f"{p}_space-dwi_model-ballstick_desc-bedpostx_dwimap"},
                 None, _dwi_arguments),
        StepSpec("track-deterministic", ("track", "deterministic"),
                 (SeedingParams, DeterministicParams, TractogramOutputParams),
                 ("seed", "mask", "stop", "include", "exclude"), ("fit-dti",), False,
                 lambda p, o: {"tractogram": f"{p}_space-dwi_desc-deterministic_tractography.trx"},
                 None, _tracking_arguments),
        StepSpec("track-probabilistic", ("track", "probabilistic"), (ProbParams, ProbOutputParams),
                 ("seed", "target", "waypoints", "exclude", "stop"), ("fit-ballstick",), False,
                 lambda p, o: {"paths": f"{p}_space-dwi_desc-probabilistic_probtrackx"},
                 None, _probabilistic_arguments),
        StepSpec("commit", ("commit",), (CommitParams,), ("mask", "peaks", "peaks-frame"),
                 ("track-deterministic",), True, _commit_primary, _commit_rename, _commit_arguments),
        StepSpec("connectome", ("connectome",), (ConnectomeParams,), ("labels", "lut", "streamline-weights"),
                 ("track-deterministic",), False,
                 lambda p, o: {"matrix": f"{p}_space-dwi_meas-{o.get('weight', 'count')}_desc-deterministic_connectome.csv"},
                 None, _connectome_arguments),
        StepSpec("profile", ("profile",), (ProfileParams,), ("map",), ("track-deterministic", "fit-dti"), False,
                 lambda p, o: {"profile": f"{p}_space-dwi_param-{_map_name(o)}_desc-deterministic_profile.csv"},
                 None, _profile_arguments),
        StepSpec("register", ("register",), (RegisterParams,), (), (), False,
                 lambda p, o: {"registration": f"{p}_from-dwi_to-{MNI_SPACE}_xfm"}, None, _register_arguments),
        StepSpec("bundles", ("bundles",), (), (), ("fit-ballstick", "register"), False,
                 lambda p, o: {"bundles": f"{p}_space-dwi_desc-bundles_tractography"}, None, _bundles_arguments,
                 parser=_bundles_parser, record=_bundles_record, extra_keys=("bundles", "seed-rng")),
        StepSpec("profiles", ("profile",), (ProfileParams, ProfileTableParams), (), ("bundles", "fit-dti"), False,
                 lambda p, o: {"profiles": f"{p}_space-dwi_desc-bundles_profiles.csv"}, None, _profiles_arguments),
    )
}  # fmt: skip

#: What each step reads from the steps it needs: ``{input key: (step, output key)}``.
READS: dict[str, dict[str, tuple[str, str]]] = {
    "track-deterministic": {"tensor": ("fit-dti", "tensor")},
    "track-probabilistic": {"samples": ("fit-ballstick", "samples")},
    "commit": {"tractogram": ("track-deterministic", "tractogram")},
    "connectome": {"tractogram": ("track-deterministic", "tractogram"), "weights": ("commit", "weights")},
    "profile": {"tractogram": ("track-deterministic", "tractogram"), "fa": ("fit-dti", "fa")},
    "bundles": {"samples": ("fit-ballstick", "samples"), "registration": ("register", "registration")},
    "profiles": {"bundles": ("bundles", "bundles"), **{m.lower(): ("fit-dti", m.lower()) for m in PROFILE_METRICS}},
}

#: Inputs a step reads only when present (the COMMIT weights of a ``--weight commit`` connectome).
OPTIONAL_READS = {("connectome", "weights")}


def _map_name(options: dict) -> str:
    given = options.get("map")
    return alphanumeric(Path(given).name.split(".")[0]) if given else "fa"


def parse_steps(text: str) -> list[str]:
    """``fit-dti,track-deterministic`` → the steps in the order the catalogue runs them."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in STEPS]
    if unknown or not names:
        raise InputError(
            f"unknown pipeline step {', '.join(unknown)}" if unknown else "--pipeline names no step",
            fix=f"Choose among: {', '.join(STEPS)} (comma-separated)",
        )
    order = list(STEPS)
    return sorted(dict.fromkeys(names), key=order.index)


@cache
def step_parser(name: str) -> argparse.ArgumentParser:
    """The subcommand's own parser (options generated from the dataclasses), or the step's own."""

    if STEPS[name].parser is not None:
        parser = STEPS[name].parser()
    else:
        parser = build_command_parser()
        for word in STEPS[name].command:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[word]
    parser.error = _refuse  # a message to raise, not a usage block printed and an exit (this parser is batch's own)
    return parser


class _ParseError(ValueError):
    """What the step's parser found wrong in a command line (argparse's message)."""


def _refuse(message: str):
    raise _ParseError(message)


def option_action(name: str, key: str) -> argparse.Action:
    for action in step_parser(name)._actions:
        if f"--{key}" in action.option_strings:
            return action
    raise KeyError(key)


def options_argv(name: str, options: dict) -> list[str]:
    """A step's config options as command-line words (``fa-threshold = 0.2`` → ``--fa-threshold 0.2``;
    ``true`` → the bare flag; a list → several values, or the flag repeated for a repeatable one)."""
    argv: list[str] = []
    for key, value in options.items():
        action = option_action(name, key)
        flag = f"--{key}"
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, list):
            if isinstance(action, argparse._AppendAction):
                for item in value:
                    argv += [flag, str(item)]
            else:
                argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def step_argv(name: str, series: Series, inputs: dict[str, Path], options: dict, device: str) -> list[str]:
    """The full command line of a step for one subject, with :data:`OUTPUT` as ``-o``."""
    spec = STEPS[name]
    given = {k: v for k, v in options.items() if k != "device"}
    device = options.get("device", device)
    return [*spec.command, *spec.arguments(series, inputs, given), *options_argv(name, given),
            "--device", device, "--quiet", "-o", OUTPUT]  # fmt: skip


def step_parameters(name: str, argv: list[str]) -> dict:
    """The parameters a command line sets, read through the subcommand's parser and dataclasses:
    ``{class name: {field: value}}``. Bad values raise the commands' own :class:`InputError`."""

    parser = step_parser(name)
    words = argv[len(STEPS[name].command) :]
    try:
        args = parser.parse_args(words)
    except _ParseError as exc:  # argparse's message, without its usage block and placeholder words
        raise InputError(str(exc), fix=f"See tractlens {' '.join(STEPS[name].command)} --help") from None
    args.command = " ".join(STEPS[name].command)
    record = STEPS[name].record(args) if STEPS[name].record is not None else {}
    return {**{t.__name__: dataclasses.asdict(params_from_args(t, args)) for t in STEPS[name].params}, **record}
