"""What a user interface needs to offer a parameter: the metadata of a dataclass field.

A parameter is defined once, as a field of a frozen dataclass whose metadata (from
:func:`meta`) gives its label, documentation, unit, limits and choices: what the parameter
is, not how a particular interface spells it. The GUI forms (``widgets.params_form``) and the
``tractlens`` options (``app.cli.options``, with the flag names of
``app.cli.parameter_flags``) are generated from it, so a default or a range exists in one place.
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
) -> dict:
    """Field metadata: label, documentation (the tooltip), unit and limits (the GUI's range).

    choices : the allowed values (a combo box; argparse ``choices``).
    """
    return {
        "label": label,
        "help": help,
        "unit": unit,
        "limits": limits,
        "choices": tuple(choices) if choices is not None else None,
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
