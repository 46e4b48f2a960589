"""The README stays a short front page: at most 200 lines, no paragraph written twice, exactly the
two set-up commands (the second is what .ci/run runs), links that lead somewhere, and no default
typed by hand (tests/test_docs.py checks that with the docs). The manual is the site in docs/.

A scripted edit once appended one section to itself over and over (182 MB, 2.6 M lines) and it
went unnoticed through three commits; the size checks make such an accident fail the suite.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "start" / "getting-started.md"
ANATOMY = ROOT / "docs" / "guide" / "anatomy.md"

DEMO_COMMAND = "bash packaging/install-deps.sh && python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tractlens --demo"
TEST_COMMAND = (
    'bash packaging/install-deps.sh && python3 -m venv .venv && .venv/bin/pip install -e ".[test]" '
    "&& .venv/bin/python -m pytest -n auto --dist loadfile"
)


def _bash_blocks(path: Path) -> list[str]:
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)]


def test_readme_has_a_bounded_size():
    size = README.stat().st_size
    assert size < 300_000, f"README.md is {size} bytes; a runaway edit?"
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; the manual belongs in docs/"


def test_no_paragraph_of_the_readme_appears_twice():
    text = README.read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n")]
    # short paragraphs (a table's header, a code fence) may repeat legitimately
    counts = Counter(p for p in paragraphs if len(p) > 200)
    repeated = [p[:80] for p, n in counts.items() if n > 1]
    assert not repeated, f"paragraphs written more than once: {repeated}"


def test_the_readme_has_exactly_the_two_commands_and_ci_runs_the_second():
    assert _bash_blocks(README) == [DEMO_COMMAND, TEST_COMMAND]
    assert _bash_blocks(GETTING_STARTED)[:2] == [DEMO_COMMAND, TEST_COMMAND]  # the docs say the same
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in ci, ".ci/run must run the README's test command"


def test_the_readme_links_lead_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def test_the_docs_state_every_atlas_with_its_licence_and_citation_as_the_code_does():
    from tractlens.app.atlases import ATLASES

    text = ANATOMY.read_text(encoding="utf-8")
    for atlas in ATLASES.values():
        assert f"| `{atlas.name}`: {atlas.title} | {atlas.licence} | {atlas.citation} |" in text, atlas.name
