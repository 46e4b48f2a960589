"""Helpers of the tests of memory-mapped tractograms: what of a file's maps is resident, and the
same file read the way that converts every point at open."""

from __future__ import annotations

import zipfile
from pathlib import Path


def file_rss(path: Path) -> int:
    """Bytes of ``path``'s memory maps in this process's resident memory (its part of RssFile)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line: range perms ... path
            inside = line.rstrip().endswith(str(path))
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


def read_eagerly(path: Path):
    """``path`` read the way that converts every point at open (a compressed copy of the .trx)."""
    from tractlens.app.io import load_tractogram

    compressed = path.with_name("z_" + path.name)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    tract = load_tractogram(compressed)
    assert tract.mapped is None
    return tract
