"""What a user interface needs to offer a parameter: the metadata of a dataclass field.

A parameter is defined once, as a field of a frozen dataclass whose metadata (from
:func:`meta`) gives its label, help, unit, limits, choices and command-line flags. The
GUI forms (``widgets.params_form``) and the ``tractlens`` options (``app.cli.options``)
are generated from it, so a default or a range exists in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def meta(
    label: str,
    help: str,
    unit: str = "",
    limits: tuple[float, float] | None = None,
    *,
    choices: Sequence[Any] | None = None,
    flags: Sequence[str] = (),
    cli: bool = True,
    metavar: str | None = None,
    negated: bool = False,
    nargs: str | None = None,
    cli_help: str | None = None,
    default_text: str | None = None,
) -> dict:
    """Field metadata: label, tooltip, unit and limits (the GUI's range), plus what the CLI needs.

    choices : the allowed values (a combo box; argparse ``choices``).
    flags : the command-line flags, the primary one first, then aliases
        (``("--seed-matrix", "--omatrix1")``); empty: ``--`` + the field name with dashes.
    cli : False for a field that is not on the command line.
    metavar : the option's placeholder in ``--help`` (default: the primary flag's name).
    negated : for a bool field that defaults to True, the flag sets it False
        (``--no-normalize`` for ``normalize``, ``--discard-truncated`` for ``keep_truncated``).
    nargs : argparse ``nargs`` for a tuple field (``"+"``).
    cli_help : the command line's help where it must say more than the tooltip (e.g. the unit
        of ``--step``, which differs between subcommands).
    default_text : how ``--help`` names a default of None (``"whole sphere"``).
    """
    return {
        "label": label,
        "help": help,
        "unit": unit,
        "limits": limits,
        "choices": tuple(choices) if choices is not None else None,
        "flags": tuple(flags),
        "cli": cli,
        "metavar": metavar,
        "negated": negated,
        "nargs": nargs,
        "cli_help": cli_help,
        "default_text": default_text,
    }


def field_of(params_type: type, name: str) -> dataclasses.Field:
    """The dataclass field ``name`` of ``params_type`` (KeyError naming both when absent)."""
    for spec in dataclasses.fields(params_type):
        if spec.name == name:
            return spec
    raise KeyError(f"{params_type.__name__} has no field {name!r}")


def default_of(params_type: type, name: str) -> Any:
    """The default of one field (a default factory is called)."""
    spec = field_of(params_type, name)
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    raise KeyError(f"{params_type.__name__}.{name} has no default")


def same_as(params_type: type, name: str, **changes) -> Any:
    """A field that repeats another dataclass's field: its default and metadata, with ``changes``
    (``default=`` and any :func:`meta` key), so a value shared by two use cases is defined once."""
    spec = field_of(params_type, name)
    metadata = dict(spec.metadata)
    default = changes.pop("default", default_of(params_type, name))
    unknown = set(changes) - set(metadata)
    if unknown:
        raise TypeError(f"unknown metadata keys: {', '.join(sorted(unknown))}")
    metadata.update(changes)
    return dataclasses.field(default=default, metadata=metadata)


def cli_flags(spec: dataclasses.Field) -> tuple[str, ...]:
    """The command-line flags of a field: its own, else ``--field-name``; () when it has none."""
    if not spec.metadata.get("cli", True):
        return ()
    return tuple(spec.metadata.get("flags") or ()) or ("--" + spec.name.replace("_", "-"),)
