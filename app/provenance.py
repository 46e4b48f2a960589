"""Provenance of a result: which inputs (path, size, time of last change), which version, which
command line.

Every JSON summary goes through here: the ``--json`` summary of each subcommand
(:func:`app.cli._common.emit`) and the ``*.json`` files written beside outputs
(:func:`write_json_summary`). From the command line, :func:`cli_invocation` is entered around the
command and gives its ``sys.argv`` and the input paths among its parsed arguments; from Python,
the writer names its call (``call=``) and its inputs, so a summary always says how it was made.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .io._atomic import write_text_atomic

#: The keys :func:`provenance` adds to a summary.
PROVENANCE_KEYS = ("version", "command_line", "inputs")
#: Argument destinations that name outputs, never inputs (even when the file exists already).
OUTPUT_DESTS = ("output", "outdir", "out")


@dataclass
class Invocation:
    """One run of the ``tractlens`` command: its argv and the input paths among its arguments."""

    command_line: list[str]
    inputs: list[str] = field(default_factory=list)


_current: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar("tractlens_invocation", default=None)


def _is_output(dest: str) -> bool:
    name = dest.lower().rsplit(".", 1)[-1]
    return name in OUTPUT_DESTS or name.startswith(("output", "save_", "write_"))


def input_paths(args: Any) -> list[str]:
    """The arguments of a parsed command line that name existing files or folders, outputs left out
    (``NAME=FILE`` words, as ``profile --map FA=dti_FA.nii.gz``, by their file)."""
    paths: list[str] = []
    for dest, value in sorted(vars(args).items()):
        if _is_output(dest):
            continue
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str) and "=" in item and not Path(item).exists():
                item = item.partition("=")[2]
            if isinstance(item, str | os.PathLike) and str(item) and Path(item).exists():
                if str(item) not in paths:
                    paths.append(str(item))
    return paths


def outputs_over_inputs(args: Any) -> list[tuple[str, str]]:
    """``(option, path)`` of each output of a parsed command line that is one of its input files
    (the same file however named): the command would replace what it reads."""
    inputs = {Path(p).resolve() for p in input_paths(args) if Path(p).is_file()}
    found = []
    for dest, value in sorted(vars(args).items()):
        if not _is_output(dest):
            continue
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str | os.PathLike) and str(item) and Path(item).is_file():
                if Path(item).resolve() in inputs:
                    found.append(("-o" if dest == "output" else "--" + dest.replace("_", "-"), str(item)))
    return found


@contextlib.contextmanager
def cli_invocation(argv: list[str] | None, args: Any = None) -> Iterator[Invocation]:
    """Within this block, summaries carry ``argv`` (``sys.argv`` when None) and the inputs of ``args``."""
    command_line = list(sys.argv) if argv is None else ["tractlens", *map(str, argv)]
    invocation = Invocation(command_line, input_paths(args) if args is not None else [])
    token = _current.set(invocation)
    try:
        yield invocation
    finally:
        _current.reset(token)


def describe_input(path: str | os.PathLike) -> dict[str, Any]:
    """Path (absolute), size in bytes (a folder: its files, not recursing) and last change (UTC, ISO 8601)."""
    path = Path(path)
    entry: dict[str, Any] = {"path": str(path.absolute())}
    try:
        stat = path.stat()
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else stat.st_size
    except OSError as exc:
        entry["error"] = exc.strerror or str(exc)
        return entry
    entry["size"] = int(size)
    entry["mtime"] = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.UTC).isoformat()
    return entry


def python_call(call: str | tuple | None) -> str | None:
    """A call as text: ``"name(arg, key=value)"`` from ``(name, *args, {key: value})``; a string as given."""
    if call is None or isinstance(call, str):
        return call
    name, *rest = call
    keywords = rest.pop() if rest and isinstance(rest[-1], Mapping) else {}
    parts = [repr(str(a)) if isinstance(a, os.PathLike) else repr(a) for a in rest]
    parts += [f"{k}={str(v)!r}" if isinstance(v, os.PathLike) else f"{k}={v!r}" for k, v in keywords.items()]
    return f"{name}({', '.join(parts)})"


def provenance(inputs: Iterable[str | os.PathLike | None] = (), call: str | tuple | None = None) -> dict[str, Any]:
    """``version``, ``command_line`` and ``inputs`` of the result being summarised.

    ``command_line``: the argv of the running ``tractlens`` command (a list), else ``call``, the
    Python call that made the result (text). ``inputs``: the command's input paths and ``inputs``
    (Nones and repeats dropped), each as :func:`describe_input` gives it."""

    invocation = _current.get()
    paths = list(invocation.inputs) if invocation is not None else []
    for item in inputs:
        if item is not None and str(item) and str(item) not in paths:
            paths.append(str(item))
    if invocation is not None:
        command_line: Any = invocation.command_line
    else:
        command_line = python_call(call) or "python: " + " ".join(sys.argv)
    return {"version": __version__, "command_line": command_line, "inputs": [describe_input(p) for p in paths]}


def with_provenance(
    summary: Mapping[str, Any], inputs: Iterable[str | os.PathLike | None] = (), call: str | tuple | None = None
) -> dict[str, Any]:
    """``summary`` with :func:`provenance` added (the summary's own values of those keys are kept)."""
    return {**provenance(inputs, call), **summary}


def write_json_summary(
    summary: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    inputs: Iterable[str | os.PathLike | None] = (),
    call: str | tuple | None = None,
) -> Path:
    """Write ``summary`` with its provenance as JSON, atomically."""

    text = json.dumps(with_provenance(summary, inputs, call), indent=2, default=str)
    return write_text_atomic(text, Path(path))
