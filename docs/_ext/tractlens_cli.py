"""The command-line reference, generated at build time from the ``tractlens`` argparse parsers.

Nothing of a command is typed by hand in the docs: its synopsis, description, options, choices
and defaults come from the parsers, whose parameter options are generated from the parameter
dataclasses (:mod:`tractlens.app.cli.options`). A command added on any branch appears here by
itself.

- ``.. tractlens-cli::`` (MyST: ````{tractlens-cli}````) writes one section per command and
  subcommand (``tractlens track deterministic``), each with the label ``cli-<command>`` (spaces
  as ``-``: ``cli-track-deterministic``) that ``{ref}`` links to from any page.
- ``{default}`COMMAND --option``` writes the option's default as the parser holds it
  (``{default}`fit-csd --response-fa``` → ``0.7``), for prose that must name a value.
- ``{flag}`COMMAND --option``` writes the option literally, and fails the build when the
  command has no such option: prose cannot name a flag that was renamed or removed.

Unknown commands and options are build warnings, so ``sphinx-build -W`` fails on a page that
names one that no longer exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

logger = logging.getLogger(__name__)

# The window and the report have parsers of their own in the launcher (they need Qt at run time,
# not to build their parsers).
WINDOW = "window"
REPORT = "report"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name after ``tractlens`` (``"track deterministic"``)."""
    from tractlens.app.cli import build_parser
    from tractlens.widgets import launcher

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen: set[int] = set()
                for name, child in action.choices.items():
                    if id(child) in seen:  # an alias of a command already listed
                        continue
                    seen.add(id(child))
                    found[" ".join((*path, name))] = child
                    walk(child, (*path, name))

    walk(build_parser(), ())
    found[WINDOW] = launcher._gui_parser()
    found[REPORT] = launcher._report_parser()
    return found


_CACHE: dict[str, argparse.ArgumentParser] = {}


def parsers() -> dict[str, argparse.ArgumentParser]:
    if not _CACHE:
        _CACHE.update(_parsers())
    return _CACHE


def summaries() -> dict[str, str]:
    """The one-line help of each command as its parent parser lists it."""
    from tractlens.app.cli import build_parser

    out: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    out[" ".join((*path, choice.dest))] = choice.help or ""
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    walk(build_parser(), ())
    return out


def label(command: str) -> str:
    return "cli-" + command.replace(" ", "-")


def shown_default(action: argparse.Action) -> str | None:
    """The default as a user would type it, or None when there is none worth stating."""
    if action.default is None or action.default is argparse.SUPPRESS:
        return None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return None  # a switch: its default is its absence
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return None
    value = action.default
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) if value else None
    if isinstance(value, str) and value == "":
        return None
    return str(value)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help is argparse.SUPPRESS:
            continue
        yield action


def find_action(command: str, option: str) -> argparse.Action | None:
    parser = parsers().get(command)
    if parser is None:
        return None
    for action in parser._actions:
        if option in action.option_strings or (not action.option_strings and action.dest == option):
            return action
    return None


def _cell(*children: nodes.Node) -> nodes.entry:
    entry = nodes.entry()
    para = nodes.paragraph()
    para.extend(children)
    entry += para
    return entry


def _table(parser: argparse.ArgumentParser) -> nodes.table | None:
    actions = list(_options(parser))
    if not actions:
        return None
    table = nodes.table(classes=["tractlens-cli-options"])
    group = nodes.tgroup(cols=3)
    table += group
    for width in (30, 14, 56):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    row = nodes.row()
    for text in ("option", "default", "meaning"):
        row += _cell(nodes.Text(text))
    head += row
    group += head
    body = nodes.tbody()
    for action in actions:
        row = nodes.row()
        if action.option_strings:
            names = ", ".join(action.option_strings)
            metavar = ""
            if action.nargs != 0:
                metavar = action.metavar or (
                    "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
                )
                if isinstance(metavar, tuple):
                    metavar = " ".join(metavar)
            spelled = f"{names} {metavar}".strip()
        else:
            spelled = action.metavar or action.dest
        row += _cell(nodes.literal(text=spelled))
        default = shown_default(action)
        row += _cell(nodes.literal(text=default)) if default is not None else _cell(nodes.Text(""))
        extra = []
        if action.required and action.option_strings:
            extra.append("required")
        if action.choices and action.option_strings and action.metavar:  # a placeholder hides the choices
            extra.append("one of " + ", ".join(map(str, action.choices)))
        meaning = _help(parser, action)
        if extra:
            meaning = (meaning + " " if meaning else "") + "[" + "; ".join(extra) + "]"
        row += _cell(nodes.Text(meaning))
        body += row
    group += body
    return table


class TractlensCli(SphinxDirective):
    """The reference of every ``tractlens`` command, one section each."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        std = self.env.get_domain("std")
        one_liners = summaries()
        out: list[nodes.Node] = []
        for command, parser in parsers().items():
            title = {WINDOW: "tractlens (the window)", REPORT: "tractlens report"}.get(command, f"tractlens {command}")
            node_id = label(command)
            section = nodes.section(ids=[node_id], names=[node_id])
            section += nodes.title(text=title)
            std.note_hyperlink_target(node_id, self.env.docname, node_id, title)
            summary = one_liners.get(command)
            description = parser.description or summary or ""
            if description:
                section += nodes.paragraph(text=description)
            usage = parser.format_usage().strip()
            section += nodes.literal_block(usage, usage, language="none")
            table = _table(parser)
            if table is not None:
                section += table
            if parser.epilog:
                section += nodes.paragraph(text=parser.epilog)
            out.append(section)
        return out


class CommandList(SphinxDirective):
    """A table of every command with its one-line help, linking to its section."""

    def run(self) -> list[nodes.Node]:
        one_liners = summaries()
        table = nodes.table()
        group = nodes.tgroup(cols=2)
        table += group
        group += nodes.colspec(colwidth=30)
        group += nodes.colspec(colwidth=70)
        body = nodes.tbody()
        for command in parsers():
            if command in (WINDOW, REPORT):
                continue
            if command not in one_liners:
                continue
            row = nodes.row()
            ref = nodes.reference("", "", internal=True, refuri=f"#{label(command)}")
            ref += nodes.literal(text=f"tractlens {command}")
            row += _cell(ref)
            row += _cell(nodes.Text(one_liners[command]))
            body += row
        group += body
        return [table]


class DefaultRole(SphinxRole):
    """``{default}`COMMAND --option``` → the option's default, from the parser."""

    def run(self):
        command, _, option = self.text.rpartition(" ")
        action = find_action(command, option)
        if action is None:
            logger.warning("{default}: no option %r in 'tractlens %s'", option, command, location=self.get_location())
            return [nodes.literal(text=self.text)], []
        value = shown_default(action)
        if value is None:
            logger.warning("{default}: 'tractlens %s %s' has no default", command, option, location=self.get_location())
            value = "?"
        return [nodes.literal(text=value)], []


class FlagRole(SphinxRole):
    """``{flag}`COMMAND --option``` → ``--option``, checked to exist on that command."""

    def run(self):
        command, _, option = self.text.rpartition(" ")
        if find_action(command, option) is None:
            logger.warning("{flag}: no option %r in 'tractlens %s'", option, command, location=self.get_location())
        return [nodes.literal(text=option)], []


def setup(app):
    app.add_directive("tractlens-cli", TractlensCli)
    app.add_directive("tractlens-commands", CommandList)
    app.add_role("default", DefaultRole())
    app.add_role("flag", FlagRole())
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
