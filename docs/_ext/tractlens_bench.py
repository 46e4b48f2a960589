"""The performance pages, generated at build time from ``tests/benchmarks/results/*.json``.

``.. tractlens-benchmarks::`` writes one section per results file: the command that made it (the
file's own ``command`` when it recorded one, else the benchmark script its name points to), the
device it ran on (the file's ``device``/``gpu``/``machine``/core-count keys), and its numbers as
tables: a flat mapping as a two-column table, a list of records or a mapping of records as one
row per record. Nothing is copied by hand: a new results file appears with the next build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "benchmarks" / "results"
BENCHMARKS = ROOT / "tests" / "benchmarks"
DEVICE_KEYS = (
    "device",
    "device_name",
    "gpu",
    "machine",
    "backend",
    "cpu_cores",
    "cores",
    "cpus",
    "cpu_count",
    "threads",
)
MAX_COLUMNS = 14
MAX_CELL = 90


def read_results(path: Path) -> tuple[object, str | None]:
    """The file's data, and a note when it had to be read leniently (trailing commas)."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        relaxed = re.sub(r",(\s*[}\]])", r"\1", text)
        try:
            return json.loads(
                relaxed
            ), f"not strict JSON ({exc.msg}, line {exc.lineno}): read without its trailing commas"
        except json.JSONDecodeError:
            raise exc from None


def command_of(path: Path, data: object) -> tuple[str | None, str | None]:
    """(the recorded command, the script its name points to)."""
    recorded = None
    if isinstance(data, dict):
        value = data.get("command")
        if isinstance(value, str):
            recorded = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            recorded = " ".join(value)
    stem = path.stem
    scripts = sorted((p.stem for p in BENCHMARKS.glob("*.py")), key=len, reverse=True)
    script = None
    for name in scripts:
        core = name.removeprefix("bench_")
        if stem.startswith(core) or stem.startswith(name):
            script = f"tests/benchmarks/{name}.py"
            break
    return recorded, script


def _compact(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _scalar(value: object) -> bool:
    return not isinstance(value, (dict, list)) or (isinstance(value, list) and len(_compact(value)) < MAX_CELL)


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["tractlens-bench"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    row = nodes.row()
    for text in header:
        entry = nodes.entry()
        entry += nodes.paragraph(text=text)
        row += entry
    head += row
    group += head
    body = nodes.tbody()
    for values in rows:
        row = nodes.row()
        for text in values:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            row += entry
        body += row
    group += body
    return table


def _records_table(records: list[tuple[str | None, dict]]) -> nodes.table:
    columns: list[str] = []
    for _name, record in records:
        for key, value in record.items():
            if _scalar(value) and key not in columns:
                columns.append(key)
    columns = columns[:MAX_COLUMNS]
    named = any(name is not None for name, _ in records)
    header = (["run"] if named else []) + columns
    rows = []
    for name, record in records:
        rows.append(([name or ""] if named else []) + [_compact(record.get(c, "")) for c in columns])
    return _table(header, rows)


def _alike(records: list[dict]) -> bool:
    """Whether mappings are records of one kind: most of their keys are shared."""
    common = set.intersection(*(set(r) for r in records))
    return len(common) >= max(1, min(len(r) for r in records) // 2)


def _records(records: list[tuple[str | None, dict]]) -> list[nodes.Node]:
    """One row per record with its scalar fields; the nested ones are named, not expanded (the
    file has them)."""
    out: list[nodes.Node] = [_records_table(records)]
    nested = sorted({k for _name, r in records for k, v in r.items() if not _scalar(v)})
    if nested:
        out.append(nodes.paragraph(text="Also in each record of the file (not shown): " + ", ".join(nested) + "."))
    return out


def render(value: object, where: str, depth: int = 0) -> list[nodes.Node]:
    """Tables for ``value``; nested structures get a rubric naming their path."""
    out: list[nodes.Node] = []
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            out.extend(_records([(None, v) for v in value]))
        else:
            out.append(nodes.paragraph(text=_compact(value)))
        return out
    if not isinstance(value, dict):
        out.append(nodes.paragraph(text=_compact(value)))
        return out
    flat = [(k, v) for k, v in value.items() if _scalar(v)]
    nested = [(k, v) for k, v in value.items() if not _scalar(v)]
    if flat:
        out.append(_table(["what", "value"], [[k, _compact(v)] for k, v in flat]))
    records = [(k, v) for k, v in nested if isinstance(v, dict) and v]
    if len(records) >= 2 and _alike([v for _k, v in records]):  # records by name (runs): a row each
        out.extend(_records(records))
        nested = [(k, v) for k, v in nested if not isinstance(v, dict)]
    for key, sub in nested:
        path = f"{where}.{key}" if where else key
        if depth >= 3:
            out.append(nodes.paragraph(text=f"{path}: {_compact(sub)}"))
        else:
            out.extend(_titled(sub, path, depth + 1))
    return out


def _titled(value: object, path: str, depth: int) -> list[nodes.Node]:
    return [nodes.rubric(text=path), *render(value, path, depth)]


class Benchmarks(SphinxDirective):
    """One section per ``tests/benchmarks/results/*.json`` whose name matches ``:pattern:`` and none of
    the comma-separated ``:exclude:`` patterns."""

    option_spec: ClassVar[dict] = {"pattern": str, "exclude": str}

    def run(self) -> list[nodes.Node]:
        pattern = self.options.get("pattern", "*.json")
        exclude = [x.strip() for x in self.options.get("exclude", "").split(",") if x.strip()]
        out: list[nodes.Node] = []
        for path in sorted(RESULTS.glob(pattern)):
            if any(path.match(x) for x in exclude):
                continue
            self.env.note_dependency(str(path))
            section_id = "bench-" + nodes.make_id(path.stem)
            section = nodes.section(ids=[section_id], names=[section_id])
            section += nodes.title(text=path.name)
            try:
                data, note = read_results(path)
            except json.JSONDecodeError as exc:
                logger.warning("%s is not JSON: %s", path.name, exc, location=self.get_location())
                continue
            recorded, script = command_of(path, data)
            facts = nodes.bullet_list()

            def fact(label: str, text: str, facts: nodes.bullet_list = facts) -> None:
                item = nodes.list_item()
                para = nodes.paragraph()
                para += nodes.strong(text=label + ": ")
                para += nodes.literal(text=text)
                item += para
                facts.append(item)

            fact("file", f"tests/benchmarks/results/{path.name}")
            if recorded:
                fact("command", recorded)
            elif script:
                fact("made by", f"python {script} (the file records no command line)")
            else:
                fact("made by", "no benchmark script of that name and no command recorded in the file")
            if isinstance(data, dict):
                for key in DEVICE_KEYS:
                    if key in data and data[key] not in (None, ""):
                        fact(key, _compact(data[key]))
            if note:
                fact("note", note)
            section += facts
            section.extend(render(data, ""))
            out.append(section)
        if not out:
            logger.warning("no benchmark results match %s", pattern, location=self.get_location())
        return out


def setup(app):
    app.add_directive("tractlens-benchmarks", Benchmarks)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
