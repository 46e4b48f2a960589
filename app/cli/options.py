"""Command-line options generated from parameter dataclasses.

:func:`add_params` adds one option per field that is on the command line: the flags, help
placeholder and negation of :mod:`app.cli.parameter_flags`, the documentation, unit and choices
of the field's metadata (``gpu.params.meta``), and the dataclass default as the argparse
default, shown in ``--help``. :func:`params_from_args`
builds the dataclass back from the parsed arguments; its validation errors become
:class:`InputError`. A default therefore exists once, in the dataclass (the DIPY workflows'
idea, there from a function's signature).

Other tools' names of TractLens options (:data:`OPTION_ALIASES`, e.g. probtrackx's ``--avoid`` for
``--exclude``) are accepted wherever the option exists: :func:`add_params` adds them to generated
options, :func:`add_option_aliases` to every other option of the finished parser, so no command
registers an alias of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tractlens.gpu.params import default_of

from ..errors import InputError
from .parameter_flags import Option, cli_flags, option_of

#: Aliases accepted wherever an option exists: ``{option: (alias, ...)}``.
OPTION_ALIASES: dict[str, tuple[str, ...]] = {
    "--exclude": ("--avoid",),  # FSL probtrackx2's name of the exclusion mask
}


def with_aliases(flags: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``flags`` and their :data:`OPTION_ALIASES` (each once, in order)."""
    out = list(flags)
    for flag in flags:
        out += [alias for alias in OPTION_ALIASES.get(flag, ()) if alias not in out]
    return tuple(out)


def add_option_aliases(parser: argparse.ArgumentParser) -> None:
    """Give every option of ``parser`` and of its subcommands (recursively) its
    :data:`OPTION_ALIASES`, unless a subcommand already uses the alias for another option."""
    seen: set[int] = set()

    def visit(p: argparse.ArgumentParser) -> None:
        if id(p) in seen:
            return
        seen.add(id(p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    visit(sub)
                continue
            for flag in list(action.option_strings):
                for alias in OPTION_ALIASES.get(flag, ()):
                    if alias not in p._option_string_actions:
                        action.option_strings.append(alias)
                        p._option_string_actions[alias] = action

    visit(parser)


def dest_of(params_type: type, name: str) -> str:
    """The argparse destination of a field: the class and field name, so no two options of a
    subcommand collide (``--method`` of deterministic tracking vs the ``track METHOD`` choice)."""
    return f"{params_type.__name__}.{name}"


def field_of_dest(dest: str) -> tuple[str, str] | None:
    """``(class name, field name)`` of a destination made by :func:`dest_of`, else None."""
    class_name, dot, name = dest.partition(".")
    return (class_name, name) if dot and class_name.endswith("Params") else None


def add_params(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    params_type: type,
    *,
    only: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
) -> None:
    """Add an option for each field of ``params_type`` with command-line flags (``only`` those
    named, none of ``exclude``), in the dataclass's field order."""
    for spec in dataclasses.fields(params_type):
        flags = cli_flags(params_type, spec.name)
        if not flags or (only is not None and spec.name not in only) or spec.name in exclude:
            continue
        parser.add_argument(*with_aliases(flags), **_argument(params_type, spec))


def _argument(params_type: type, spec: dataclasses.Field) -> dict[str, Any]:
    meta = spec.metadata
    option = option_of(params_type, spec.name)
    default = default_of(params_type, spec.name)
    kwargs: dict[str, Any] = {"dest": dest_of(params_type, spec.name), "default": default}
    if isinstance(default, bool):
        if default != option.negated:
            raise TypeError(
                f"{params_type.__name__}.{spec.name}: a flag can only change a bool from its default; "
                "a True default needs a negated flag (Option(negated=True) in app.cli.parameter_flags)"
            )
        kwargs["action"] = "store_false" if option.negated else "store_true"
        kwargs["help"] = _escape(option.help or meta["help"])
        return kwargs
    kwargs["type"] = _value_type(spec, default)
    if meta.get("choices") is not None:
        kwargs["choices"] = meta["choices"]
    if option.nargs:
        kwargs["nargs"] = option.nargs
    if option.metavar:
        kwargs["metavar"] = option.metavar
    elif meta.get("choices") is None:
        kwargs["metavar"] = cli_flags(params_type, spec.name)[0].lstrip("-").upper().replace("-", "_")
    kwargs["help"] = _help(meta, option, default)
    return kwargs


def _value_type(spec: dataclasses.Field, default: Any) -> type:
    if isinstance(default, (tuple, list)):
        return type(default[0]) if default else float
    if default is not None:
        return type(default)
    annotation = str(spec.type)  # postponed annotations are strings: "float | None"
    for kind in (int, float, str):
        if kind.__name__ in annotation:
            return kind
    raise TypeError(f"cannot tell the command-line type of {spec.name} ({annotation})")


def _help(meta, option: Option, default: Any) -> str:
    text = option.help or meta["help"]
    unit = meta.get("unit", "")
    if default is None:
        shown = option.default_text or "none"
    elif isinstance(default, (tuple, list)):
        shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
    elif isinstance(default, float):
        shown = f"{default:g}"
    else:
        shown = str(default)
    if unit and unit not in text and unit not in ("°", "%"):
        text += f", {unit}"
    return _escape(f"{text} (default {shown})")


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def params_from_args(params_type: type, args: argparse.Namespace, *, fix: str | None = None, **values: Any):
    """The dataclass from the parsed options (fields without an option keep their default;
    ``values`` override); a ValueError of its validation becomes an :class:`InputError`."""
    for spec in dataclasses.fields(params_type):
        dest = dest_of(params_type, spec.name)
        if spec.name not in values and hasattr(args, dest):
            value = getattr(args, dest)
            values[spec.name] = tuple(value) if isinstance(value, list) else value
    try:
        return params_type(**values)
    except ValueError as exc:
        command = " ".join(part for part in (getattr(args, "command", None), getattr(args, "method", None)) if part)
        raise InputError(str(exc), fix=fix or f"Check the options (see tractlens {command} --help)") from exc
