"""Label lookup tables: names (and colours) of the labels of a parcellation.

Reads the text tables the field uses, one label per line:

* FreeSurfer ``FreeSurferColorLUT.txt`` and MRtrix LUTs: ``index name R G B [A]``
  (whitespace separated, ``#`` comments);
* BIDS ``*_dseg.tsv``: a header line with ``index`` and ``name`` columns (tab separated,
  ``color`` as ``#rrggbb`` optional);
* a plain ``index name`` list, or the same comma separated.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError


@dataclass
class LabelTable:
    """Label value → name and RGB colour (0..255)."""

    names: dict[int, str] = field(default_factory=dict)
    colours: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    source: str = ""

    def name(self, label: int) -> str:
        return self.names.get(int(label), f"label_{int(label)}")


LUT_FIX = "Each line must be 'index name [R G B [A]]' (FreeSurfer/MRtrix LUT), or give a BIDS dseg.tsv"


def _hex_colour(text: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"#?([0-9a-fA-F]{6})", text.strip())
    if not match:
        return None
    value = match.group(1)
    return tuple(int(value[i : i + 2], 16) for i in (0, 2, 4))


def load_lut(path: str | os.PathLike) -> LabelTable:
    """Read a lookup table; :class:`InputError` naming the line when it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise InputError("the lookup table does not exist", path=path, fix="Check the path")
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise InputError(
            "the lookup table is not a text file", path=path, fix="Give a FreeSurfer/MRtrix LUT or a BIDS dseg.tsv"
        ) from exc
    table = LabelTable(source=str(path))
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError("the lookup table has no entries", path=path, fix=LUT_FIX)
    columns = None
    first = re.split(r"\t|,", lines[0].strip()) if ("\t" in lines[0] or "," in lines[0]) else lines[0].split()
    if first and first[0].strip().lower() == "index":
        columns = [c.strip().lower() for c in first]
        if "name" not in columns:
            raise InputError(
                "the table's header has no 'name' column",
                path=path,
                fix="A BIDS dseg.tsv has 'index' and 'name' columns",
            )
        lines = lines[1:]
    for number, line in enumerate(lines, start=2 if columns else 1):
        parts = re.split(r"\t|,", line.strip()) if columns or "," in line else line.split()
        parts = [p.strip() for p in parts]
        try:
            label = int(parts[0])
        except (ValueError, IndexError):
            raise InputError(
                f"line {number} does not start with a label number: {line.strip()[:60]!r}",
                path=path,
                fix=LUT_FIX,
            ) from None
        if label < 0:
            raise InputError(f"line {number}: label {label} is negative", path=path, fix="Label numbers start at 0")
        if columns:
            row = dict(zip(columns, parts))
            name = row.get("name", "")
            colour = _hex_colour(row.get("color", row.get("colour", "")))
        else:
            if len(parts) < 2:
                raise InputError(f"line {number} has a label number but no name", path=path, fix=LUT_FIX)
            name = parts[1]
            colour = None
            if len(parts) >= 5:
                try:
                    colour = tuple(max(0, min(255, int(float(v)))) for v in parts[2:5])
                except ValueError:
                    colour = None
        if label in table.names and table.names[label] != name:
            raise InputError(
                f"label {label} is named twice ({table.names[label]!r}, {name!r})",
                path=path,
                fix="Keep one line per label number",
            )
        table.names[label] = name or f"label_{label}"
        if colour is not None:
            table.colours[label] = colour
    return table
