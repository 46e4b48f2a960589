"""The ``tractlens`` command line.

Subcommands call the same pipelines as the GUI. Progress goes to stderr,
``--json`` prints a machine-readable summary on stdout, and bad input ends
with a one-paragraph message and exit status 2 (no traceback; ``--debug``
shows one). Exit status 1 means an internal error, 130 an interrupted run.

The options that are parameters are generated from the parameter dataclasses
(:mod:`.options`); one module per command group adds its subcommands:
:mod:`.info` (info, demo-data), :mod:`.fit` (fit-dti, fit-ballstick), :mod:`.model` (fit-model), :mod:`.csd` (fit-csd), :mod:`.commit`,
:mod:`.connectivity` (select, connectome, profile, distance), :mod:`.track`, :mod:`.stats`,
:mod:`.dicom` (import-dicom, export-dicom), :mod:`.anatomy` (register, apply-transform, atlas),
:mod:`.tractometry` (profile --bundles, plot-profiles) and :mod:`.batch` (the pipelines over a BIDS dataset, on Dask).
"""

from __future__ import annotations

import argparse
import logging
import sys

from tractlens.gpu.backend import BackendError, Cancelled, OutOfDeviceMemory

from ..errors import InputError
from ..provenance import cli_invocation, outputs_over_inputs
from ..timing import recorder, write_timings
from . import batch
from ._common import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, Progress
from .options import add_option_aliases
from .parser import command_parsers

__all__ = ["EXIT_INPUT", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "Progress", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``tractlens`` program: the single-subject commands (:func:`.parser.build_command_parser`)
    and ``batch``, which runs them over a cohort."""
    parser, sub, common = command_parsers()
    batch.add_parsers(sub, common)
    add_option_aliases(parser)  # other tools' names (--avoid for --exclude) on every command that has the option
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced after set-up)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _say_when_compiling(quiet: bool) -> None:
    """The engine's 'compiling GPU kernels (first use only)…' as one plain line on stderr
    (nothing with ``--quiet``)."""
    logger = logging.getLogger("tractlens.gpu.cuda")
    handler = next((h for h in logger.handlers if getattr(h, "tractlens_cli", False)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("tractlens: %(message)s"))
        handler.tractlens_cli = True
        logger.addHandler(handler)
    handler.setLevel(logging.CRITICAL + 1 if quiet else logging.INFO)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # the GUI launcher handles the no-command case
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="tractlens: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    _say_when_compiling(args.quiet)
    recorder().reset()  # timings of this command only (read by --json and $TRACTLENS_TIMINGS)
    try:
        with cli_invocation(argv, args):  # the command line and inputs in every JSON summary
            _refuse_output_over_input(args)
            return args.func(args)
    except (InputError, BackendError) as exc:
        if args.debug:
            raise
        print(f"tractlens {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except OutOfDeviceMemory as exc:
        if args.debug:
            raise
        print(f"tractlens {args.command}: error: {exc}. Try --device cpu or a smaller mask.", file=sys.stderr)
        return EXIT_INPUT
    except (KeyboardInterrupt, Cancelled):
        print(f"tractlens {args.command}: interrupted; nothing half-written was left behind.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"tractlens {args.command}: internal error: {type(exc).__name__}: {exc}. "
            "Run again with --debug for the traceback and report it.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    finally:
        _write_timings(args)


def _refuse_output_over_input(args) -> None:
    """One check for every command: an output that is one of its inputs would replace it."""
    for option, path in outputs_over_inputs(args):
        raise InputError(
            f"the output ({option}) is also an input of this command; it would be replaced",
            path=path,
            fix="Give another output name",
        )


def _write_timings(args) -> None:
    """The command's read/compute/write split to ``$TRACTLENS_TIMINGS``, when that names a file."""
    command = " ".join(filter(None, (args.command, getattr(args, "method", None))))
    try:
        write_timings(extra={"command": command})
    except OSError as exc:
        logging.getLogger("tractlens").warning("could not write the timings: %s", exc)
