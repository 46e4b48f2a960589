"""The task graph of a cohort run: one :class:`.task.StepJob` per subject and step, each
reading the outputs of the steps before it (in this run, or from an earlier run's derivatives)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..pipelines.dti import dti_file_name
from .config import subject_options
from .dataset import Series
from .naming import entity_prefix, subject_folder
from .steps import OPTIONAL_READS, READS, STEPS, step_argv
from .task import StepJob


@dataclass(frozen=True)
class Plan:
    """The jobs, in an order where every job comes after the ones it reads from."""

    jobs: list[StepJob]
    #: for each job (by index), the indices of the jobs it waits for
    waits_for: list[list[int]]
    steps: list[str]
    series: list[Series]


def _required_options(name: str, options: dict) -> None:
    if name == "connectome" and "labels" not in options:
        raise InputError(
            "the connectome step needs a parcellation per subject",
            fix='Give it in the config: [connectome] labels = "path/sub-{subject}_dseg.nii.gz" '
            "(on the DWI grid; {subject} and {session} are filled in)",
        )


def _file_inputs(name: str, options: dict) -> dict[str, str]:
    """The per-subject files a step's options name, as fingerprinted inputs."""
    found = {}
    for key in STEPS[name].file_keys:
        value = options.get(key)
        if key == "peaks-frame" or value is None:
            continue
        for i, path in enumerate(value if isinstance(value, list) else [value]):
            found[f"{key}[{i}]" if isinstance(value, list) else key] = path
    return found


def _aliases(name: str, inputs: dict[str, Path], options: dict) -> dict[str, str]:
    """Inputs the step must see under the single-subject command's file name."""
    if name == "profile" and "map" not in options:
        return {str(inputs["fa"]): dti_file_name("FA")}  # fit-dti's name: the CSV's columns are dti_FA_mean, ...
    return {}


def build_plan(
    series: list[Series],
    steps: list[str],
    config: dict[str, dict],
    derivatives: Path,
    *,
    device: str,
    staging: Path,
    generated_by: list[str],
) -> Plan:
    """The jobs of every series and step. An input from a step not in this run must already be in
    the derivatives; otherwise the error names the subjects and the step to add."""
    for name in steps:
        _required_options(name, config.get(name, {}))
    jobs: list[StepJob] = []
    waits: list[list[int]] = []
    absent: dict[str, list[str]] = {}
    for one in series:
        prefix = entity_prefix(one.subject, one.session)
        folder = subject_folder(derivatives, one.subject, one.session)
        index: dict[str, int] = {}
        for name in steps:
            options = subject_options(config.get(name, {}), name, one)
            inputs: dict[str, Path] = {}
            upstream = []
            for role, (source, key) in READS.get(name, {}).items():
                optional = (name, role) in OPTIONAL_READS
                if optional and not (name == "connectome" and options.get("weight") == "commit"):
                    continue
                source_options = subject_options(config.get(source, {}), source, one)
                inputs[role] = folder / STEPS[source].primary(prefix, source_options)[key]
                if source in index:
                    upstream.append(index[source])
                elif not inputs[role].exists():
                    absent.setdefault(source, []).append(prefix)
            argv = step_argv(name, one, inputs, options, device)
            raw = (
                {"dwi": one.dwi, "bval": one.bval, "bvec": one.bvec}
                if name in ("fit-dti", "fit-ballstick", "commit", "register")
                else {}
            )
            every = {**{k: str(v) for k, v in raw.items() if v is not None},
                     **{k: str(v) for k, v in inputs.items()}, **_file_inputs(name, options)}  # fmt: skip
            index[name] = len(jobs)
            jobs.append(
                StepJob(
                    step=name,
                    subject=prefix,
                    argv=tuple(argv),
                    inputs=every,
                    folder=str(folder),
                    primary=tuple(STEPS[name].primary(prefix, options).values()),
                    options=options,
                    staging=str(staging),
                    generated_by=tuple(generated_by),
                    aliases=_aliases(name, inputs, options),
                )
            )
            waits.append(sorted(set(upstream)))
    if absent:
        source, subjects = next(iter(absent.items()))
        shown = ", ".join(sorted(set(subjects))[:5]) + (" ..." if len(set(subjects)) > 5 else "")
        raise InputError(
            f"{source}'s outputs are not in the derivatives for {shown}, and {source} is not in --pipeline",
            path=derivatives,
            fix=f"Add {source} to --pipeline",
        )
    return Plan(jobs, waits, steps, series)
