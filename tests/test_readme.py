"""The README stays a readable document: a bounded size and no paragraph written twice.

A scripted edit once appended one section to itself over and over (182 MB, 2.6 M lines) and it
went unnoticed through three commits; these checks make such an accident fail the suite.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_has_a_bounded_size():
    size = README.stat().st_size
    assert size < 300_000, f"README.md is {size} bytes; a runaway edit?"


def test_no_paragraph_of_the_readme_appears_twice():
    text = README.read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n")]
    # short paragraphs (a table's header, a code fence) may repeat legitimately
    counts = Counter(p for p in paragraphs if len(p) > 200)
    repeated = [p[:80] for p, n in counts.items() if n > 1]
    assert not repeated, f"paragraphs written more than once: {repeated}"


def test_the_readme_states_every_atlas_with_its_licence_and_citation_as_the_code_does():
    from tractlens.app.atlases import ATLASES

    text = README.read_text(encoding="utf-8")
    for atlas in ATLASES.values():
        assert f"| `{atlas.name}`: {atlas.title} | {atlas.licence} | {atlas.citation} |" in text, atlas.name
