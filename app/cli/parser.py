"""The parser of the single-subject commands (fit, track, commit, register, …): what ``tractlens batch``
runs for each subject reads its command lines with it, and the ``tractlens`` program
(:func:`tractlens.app.cli.build_parser`) adds ``batch`` to it."""

from __future__ import annotations

import argparse

from .. import __version__
from .anatomy import add_parsers as add_anatomy
from .bundles import add_parsers as add_bundles
from .commit import add_parsers as add_commit
from .connectivity import add_parsers as add_connectivity
from .csd import add_parsers as add_csd
from .dicom import add_parsers as add_dicom
from .envelopes import add_parsers as add_envelopes
from .fit import add_parsers as add_fit
from .info import add_parsers as add_info
from .model import add_parsers as add_model
from .options import add_option_aliases
from .stats import add_parsers as add_stats
from .track import add_parsers as add_track
from .tractometry import add_parsers as add_tractometry


def command_parsers() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction, argparse.ArgumentParser]:
    """The program's parser with the single-subject commands, its subparsers (to add more
    commands to) and the parent parser of the options every command takes."""
    parser = argparse.ArgumentParser(
        prog="tractlens",
        description="GPU diffusion MRI tractography. Without a command, or with --demo or "
        "'view FILE...', tractlens opens the main window (--screenshot PNG, --size WxH, --exit).",
    )
    parser.add_argument("--version", action="version", version=f"tractlens {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    common.add_argument("--quiet", action="store_true", help="no progress on stderr")
    common.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_info(sub, common)
    add_fit(sub, common)
    add_model(sub, common)
    add_csd(sub, common)
    add_commit(sub, common)
    add_connectivity(sub, common)
    add_envelopes(sub, common)
    add_track(sub, common)
    add_stats(sub, common)
    add_dicom(sub, common)
    add_anatomy(sub, common)
    add_tractometry(sub, common)
    add_bundles(sub, common)
    return parser, sub, common


def build_command_parser() -> argparse.ArgumentParser:
    """The parser of the single-subject commands (every command but ``batch``)."""
    parser, _sub, _common = command_parsers()
    add_option_aliases(parser)
    return parser
