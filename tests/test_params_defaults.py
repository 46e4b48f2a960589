"""Each parameter default exists once: every command-line option that is a dataclass field has
the dataclass's default, every field with a flag is on its subcommand, and the pipelines'
keyword defaults are the dataclasses' (the panels: tests/gui/test_params_panels.py)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import numpy as np
import pytest

from tractlens.app.cli import build_parser
from tractlens.app.cli.options import field_of_dest
from tractlens.app.cli.parameter_flags import OPTIONS, check_table, cli_flags, option_of
from tractlens.app.params import PARAMS_TYPES, GeodesicSeedingParams, SeedingParams
from tractlens.gpu.params import default_of, field_of
from tractlens.widgets.launcher import _report_parser

TYPES = {cls.__name__: cls for cls in PARAMS_TYPES}
FLAG_OWNERS: dict[str, list[tuple[type, str]]] = {}
for _cls in PARAMS_TYPES:
    for _spec in dataclasses.fields(_cls):
        for _flag in cli_flags(_cls, _spec.name):
            FLAG_OWNERS.setdefault(_flag, []).append((_cls, _spec.name))


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix}{name} ")
    if prefix:
        yield prefix.strip(), parser


SUBCOMMANDS = dict(_subcommands(build_parser())) | {"report": _report_parser()}


def _options(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


#: Hand-written options that take a field in another unit, converted in one place: (command, dest).
#: ``track geodesic --step`` is millimetres like ``track deterministic --step`` (DeterministicParams.step_mm);
#: app.cli.track.geodesic_params converts it into GeodesicParams.step (voxels), whose own flag is --step-vox.
CONVERTED = {("track geodesic", "geodesic_step_mm")}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_parameter_option_has_its_dataclass_default(command):
    for action in _options(SUBCOMMANDS[command]):
        owners = [o for flag in action.option_strings for o in FLAG_OWNERS.get(flag, [])]
        mapped = field_of_dest(action.dest)
        if (command, action.dest) in CONVERTED:  # the same name and unit as the owners' field
            continue
        if mapped is None:
            assert not owners, f"{command} {action.option_strings}: hand-written, but the flag is {owners}'s field"
            continue
        cls, name = TYPES[mapped[0]], mapped[1]
        assert (cls, name) in owners, f"{command} {action.option_strings} is not {cls.__name__}.{name}'s flag"
        default = default_of(cls, name)
        spec = next(s for s in dataclasses.fields(cls) if s.name == name)
        if isinstance(default, bool):  # a negated flag stores False; its default is the field's True
            assert isinstance(
                action, argparse._StoreFalseAction if option_of(cls, name).negated else argparse._StoreTrueAction
            )
        assert action.default == default, f"{command} {action.option_strings}: {action.default!r} != {default!r}"
        if action.choices is not None:
            assert tuple(action.choices) == tuple(spec.metadata["choices"])
        if default is not None and not isinstance(default, bool):
            assert "default" in (action.help or ""), f"{command} {action.option_strings}: help shows no default"


def _params_types_of(parser) -> set[type]:
    return {TYPES[m[0]] for a in _options(parser) if (m := field_of_dest(a.dest))}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_field_with_a_flag_is_on_its_subcommand(command):
    parser = SUBCOMMANDS[command]
    dests = {a.dest: a for a in _options(parser)}
    for cls in _params_types_of(parser):
        for spec in dataclasses.fields(cls):
            flags = cli_flags(cls, spec.name)
            if not flags:
                continue
            dest = f"{cls.__name__}.{spec.name}"
            assert dest in dests, f"{command}: {cls.__name__}.{spec.name} ({flags[0]}) is missing"
            assert set(flags) <= set(dests[dest].option_strings), (command, flags, dests[dest].option_strings)


def test_the_commands_use_the_parameter_classes():
    expected = {
        "fit-dti": {"DTIFitParams"},
        "fit-ballstick": {"BallStickParams"},
        "commit": {"CommitParams"},
        "connectome": {"ConnectomeParams"},
        "profile": {"ProfileParams", "ProfileTableParams"},
        "distance": {"LesionDistanceParams"},
        "envelopes": {"EnvelopeParams"},
        "track deterministic": {
            "DeterministicParams",
            "FodDeterministicParams",
            "SeedingParams",
            "TractogramOutputParams",
        },
        "track fod-probabilistic": {"FodProbabilisticParams", "SeedingParams", "TractogramOutputParams"},
        "track geodesic": {"GeodesicParams", "MetricParams", "GeodesicSeedingParams"},
        "track probabilistic": {"ProbParams", "ProbOutputParams"},
        "report": {"ReportParams"},
    }
    for command, names in expected.items():
        assert {cls.__name__ for cls in _params_types_of(SUBCOMMANDS[command])} == names, command


def test_step_aliases_name_their_unit():
    det = SUBCOMMANDS["track deterministic"].parse_args(["--dwi", "d", "--seed", "s", "-o", "o", "--step-mm", "0.7"])
    geo = SUBCOMMANDS["track geodesic"].parse_args(["--dwi", "d", "--seed", "s", "-o", "o", "--step-vox", "0.2"])
    assert getattr(det, "DeterministicParams.step_mm") == 0.7 and getattr(geo, "GeodesicParams.step") == 0.2
    # One option name, one unit: --step is millimetres in every tracking command.
    assert "in mm" in _help_of("track deterministic", "--step") and "in mm" in _help_of("track geodesic", "--step")
    assert "voxels" in _help_of("track geodesic", "--step-vox")


GEODESIC = ["--dwi", "d", "--seed", "s", "-o", "o"]


@pytest.mark.parametrize(
    "argv, voxel_size, step_vox",
    [
        (["--step", "0.5"], (2.0, 2.0, 2.5), 0.25),  # mm over the smallest voxel size
        (["--step-mm", "0.3"], (1.5, 1.0, 1.0), 0.3),
        (["--step-vox", "0.2"], (2.0, 2.0, 2.0), 0.2),  # voxels, as given
        ([], (2.0, 2.0, 2.0), 0.1),  # the dataclass's default, in voxels
    ],
)
def test_geodesic_step_is_mm_and_step_vox_voxels(argv, voxel_size, step_vox):
    from types import SimpleNamespace

    from tractlens.app.cli.track import geodesic_params

    args = SUBCOMMANDS["track geodesic"].parse_args([*GEODESIC, *argv])
    args.method = "geodesic"
    params = geodesic_params(args, SimpleNamespace(voxel_size=np.array(voxel_size)))
    assert params.step == pytest.approx(step_vox, rel=1e-12)


def test_geodesic_step_takes_one_unit_at_a_time(capsys):
    with pytest.raises(SystemExit):
        SUBCOMMANDS["track geodesic"].parse_args([*GEODESIC, "--step", "0.5", "--step-vox", "0.2"])
    assert "not allowed with argument" in capsys.readouterr().err


def _help_of(command, flag):
    return next(a.help for a in _options(SUBCOMMANDS[command]) if flag in a.option_strings)


def test_pipeline_keyword_defaults_are_the_dataclasses():
    from tractlens.app.pipelines import connectivity, track
    from tractlens.gpu import connectivity as gpu_connectivity
    from tractlens.gpu import tractometry

    cases = [
        (track.deterministic_pipeline, SeedingParams, {"seeds_per_voxel": "seeds_per_voxel", "placement": "placement",
                                                      "rng_seed": "rng_seed"}),
        (track.geodesic_pipeline, GeodesicSeedingParams, {n: n for n in ("seeds_per_voxel", "directions", "cone_deg",
                                                                           "top_percent", "placement", "rng_seed")}),
        (connectivity.compute_connectome, TYPES["ConnectomeParams"], {"weight": "weight", "radius_mm": "radius_mm"}),
        (connectivity.compute_profile, TYPES["ProfileParams"], {"n_points": "n_points", "weighting": "weighting"}),
        (gpu_connectivity.assign_endpoints, TYPES["EndpointParams"], {"radius_mm": "radius_mm"}),
        (tractometry.profile, TYPES["ProfileParams"], {"n_points": "n_points", "weighting": "weighting"}),
        (tractometry.node_weights, TYPES["ProfileParams"], {"weighting": "weighting"}),
    ]  # fmt: skip
    for function, cls, names in cases:
        signature = inspect.signature(function)
        for argument, name in names.items():
            assert signature.parameters[argument].default == default_of(cls, name), (function.__name__, argument)
    assert connectivity.DEFAULT_MARGIN_MM == default_of(TYPES["LesionDistanceParams"], "margin_mm")
    assert gpu_connectivity.DEFAULT_RADIUS_MM == default_of(TYPES["EndpointParams"], "radius_mm")


def test_limits_hold_the_default_and_choices_hold_it_too():
    for cls in PARAMS_TYPES:
        for spec in dataclasses.fields(cls):
            default, meta = default_of(cls, spec.name), spec.metadata
            assert meta.get("label") and meta.get("help"), f"{cls.__name__}.{spec.name} lacks a label or help"
            if meta.get("limits") and isinstance(default, (int, float)) and not isinstance(default, bool):
                lo, hi = meta["limits"]
                assert lo <= default <= hi, f"{cls.__name__}.{spec.name}: {default} outside {meta['limits']}"
            if meta.get("choices") is not None:
                assert default in meta["choices"], f"{cls.__name__}.{spec.name}"
            cls(**{spec.name: default})  # the default passes the validation


def test_a_bad_value_is_an_input_error_with_a_fix():
    from tractlens.app.cli.options import params_from_args
    from tractlens.app.errors import InputError
    from tractlens.gpu.deterministic import DeterministicParams

    args = SUBCOMMANDS["track deterministic"].parse_args(
        ["--dwi", "d", "--seed", "s", "-o", "o", "--fa-threshold", "2"]
    )
    with pytest.raises(InputError, match="FA threshold") as raised:
        params_from_args(DeterministicParams, args, fix="Check it")
    assert raised.value.fix == "Check it"


def test_the_flag_table_names_only_fields_of_parameter_classes():
    """A renamed or removed field cannot leave a stale command-line option behind."""
    check_table()
    assert set(OPTIONS) <= set(PARAMS_TYPES)


def test_the_dataclasses_carry_what_a_parameter_is_not_how_the_command_line_spells_it():
    """Flags, placeholders and command-line help live in app.cli.parameter_flags; the engine's
    dataclasses keep label, documentation, unit, range and choices."""
    command_line = {"flags", "cli", "metavar", "negated", "nargs", "cli_help", "default_text"}
    for cls in PARAMS_TYPES:
        for spec in dataclasses.fields(cls):
            assert {"label", "help", "unit", "limits", "choices"} <= set(spec.metadata), (cls.__name__, spec.name)
            assert not command_line & set(spec.metadata), (cls.__name__, spec.name)


def test_gui_presets_are_declared_fields_within_their_limits():
    """A window's starting value that differs from the default is declared in app.params (not a
    panel's constant), names a real field, is a valid value of it, and differs from the default."""
    from tractlens.app.params import GUI_PRESETS, gui_preset
    from tractlens.gpu.probabilistic_params import ProbParams

    for params_type, values in GUI_PRESETS.items():
        for name, value in values.items():
            assert value != default_of(params_type, name), (params_type.__name__, name)
            params_type(**{name: value})  # the dataclass's own checks accept it
            lo, hi = field_of(params_type, name).metadata["limits"]
            assert lo <= value <= hi
    assert gui_preset(ProbParams, "n_samples") == 1000 and default_of(ProbParams, "n_samples") == 5000
    assert gui_preset(ProbParams, "step_mm") == default_of(ProbParams, "step_mm")  # no preset: the default
