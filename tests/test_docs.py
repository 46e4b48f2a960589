"""The documentation site (docs/): it builds with no warning, its Python API examples run, its
tutorials' command lines parse with the real ``tractlens`` parser, and no default is typed by hand
in it or in the README.

The build runs ``sphinx-build -W --keep-going`` (warnings are errors) into a temporary folder, as
CI does through this test; the CLI reference and the performance tables are generated during that
build from the parsers and ``tests/benchmarks/results/*.json`` (docs/_ext)."""

from __future__ import annotations

import argparse
import doctest
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

# Sphinx and its extensions come with the test extra (the docs extra in it): no skip without them.


SPHINX = (sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q")


def test_the_docs_build_with_no_warning(tmp_path):
    out = tmp_path / "html"
    run = subprocess.run(
        [*SPHINX, "-b", "html", "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert "WARNING" not in run.stderr, run.stderr[-8000:]
    cli = (out / "reference" / "cli.html").read_text(encoding="utf-8")
    # The reference is generated from the parsers: every command has its section.
    from tractlens_cli import label, parsers

    for command in parsers():
        assert f'id="{label(command)}"' in cli, command
    # A default in the reference is the parser's, which is the dataclass's.
    from tractlens.gpu.deterministic import DeterministicParams

    section = cli[cli.index('id="cli-track-deterministic"') :]
    table = section[section.index("<table") :]
    row = table[table.index('<span class="pre">--fa-threshold</span>') :][:600]  # its row's cells
    assert f">{DeterministicParams().fa_threshold}<" in row, row
    # A feature page another branch adds at the top of docs/ is in the navigation by itself.
    index = (out / "index.html").read_text(encoding="utf-8")
    for page in [*DOCS.glob("*.md"), *DOCS.glob("*.rst")]:
        if page.stem != "index":
            assert f'href="{page.stem}.html"' in index, page.name
    # Every results file has its generated section in the performance pages.
    performance = "".join(p.read_text(encoding="utf-8") for p in (out / "performance").glob("*.html"))
    for results in (ROOT / "tests" / "benchmarks" / "results").glob("*.json"):
        assert f"bench-{results.stem.replace('_', '-').lower()}" in performance, results.name


# --- the Python API's examples ---------------------------------------------------------------


def documented_functions() -> list[str]:
    text = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    return re.findall(r"^\.\. autofunction:: (\S+)$", text, re.M)


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_api_page_documents_functions_that_exist():
    names = documented_functions()
    assert len(names) >= 8, names
    for name in names:
        assert callable(_resolve(name)), name


@pytest.mark.parametrize("name", documented_functions())
def test_each_documented_function_has_numpydoc_sections_and_its_example_runs(name, tmp_path, monkeypatch):
    from numpydoc.docscrape import FunctionDoc

    function = _resolve(name)
    doc = FunctionDoc(function)
    assert doc["Parameters"], f"{name}: no Parameters section"
    assert doc["Returns"] or doc["Yields"], f"{name}: no Returns/Yields section"
    assert "".join(doc["References"]).strip(), f"{name}: no References section"
    assert "".join(doc["Examples"]).strip(), f"{name}: no Examples section"
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    tests = doctest.DocTestFinder().find(function, name, globs={})
    examples = sum(len(t.examples) for t in tests)
    assert examples, f"{name}: its Examples section has no >>> lines"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (see the output above)"


# --- the tutorials ---------------------------------------------------------------------------


def fenced_blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced code block, read fence by fence (a closing fence never
    opens the next block)."""
    blocks, language, lines = [], None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if language is None and line.startswith("```"):
            language, lines = line[3:].strip(), []
        elif language is not None and line.startswith("```"):
            blocks.append((language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


def _code_blocks(path: Path, language: str) -> list[str]:
    return [text for lang, text in fenced_blocks(path) if lang == language]


def tutorial_command_lines() -> list[tuple[str, str]]:
    found = []
    for page in sorted((DOCS / "tutorials").glob("*.md")):
        for block in _code_blocks(page, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                if line.startswith("tractlens"):
                    found.append((page.name, line))
    return found


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    from tractlens.app.cli import build_parser
    from tractlens.widgets import launcher

    if argv and argv[0] == "report":
        return launcher._report_parser(), argv[1:]
    if launcher.is_gui_call(argv):
        return launcher._gui_parser(), argv[1:] if argv and argv[0] == "view" else argv
    return build_parser(), argv


def test_the_tutorials_have_their_commands():
    pages = {page for page, _ in tutorial_command_lines()}
    assert pages == {"presurgical.md", "cohort.md"}
    commands = {shlex.split(line, comments=True)[1] for _, line in tutorial_command_lines()}
    for needed in ("import-dicom", "fit-dti", "track", "distance", "report", "export-dicom", "batch", "connectome"):
        assert needed in commands, needed


SYNOPSIS = re.compile(r"[\[\]|…{}()]|\.\.\.|\b[A-Z_]{3,}\b")  # a usage line, not a command to run


def concrete_command_lines() -> list[tuple[str, str]]:
    """Every ``tractlens`` line of a code block of any page that is a command someone would run
    (not a synopsis with brackets, alternatives or placeholders), continuation lines joined."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.parts:
            continue
        for language, block in fenced_blocks(page):
            if language not in ("bash", "console", ""):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if line.startswith("tractlens ") and not SYNOPSIS.search(line):
                    found.append((page.relative_to(DOCS).as_posix(), line))
    return found


def test_the_guide_has_command_lines_checked_too():
    pages = {page for page, _ in concrete_command_lines()}
    assert {"guide/cohorts.md", "guide/models.md", "tutorials/presurgical.md"} <= pages, pages


@pytest.mark.parametrize(("page", "line"), concrete_command_lines())
def test_each_command_line_of_the_docs_parses(page, line, capsys):
    argv = shlex.split(line, comments=True)[1:]
    parser, args = _parser_for(argv)
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{page}: `{line}` does not parse ({exc.code}): {capsys.readouterr().err}")


def test_the_cohort_tutorials_config_is_valid(tmp_path):
    from tractlens.app.batch.config import load_config

    (block,) = _code_blocks(DOCS / "tutorials" / "cohort.md", "toml")
    config = tmp_path / "params.toml"
    config.write_text(block)
    steps = ["fit-dti", "track-deterministic", "connectome"]
    loaded = load_config(config, steps)
    assert loaded["track-deterministic"]["max-angle"] == 35


def test_the_cohort_tutorials_table_script_runs_on_derivatives(tmp_path):
    """The pandas script of the cohort tutorial, on two subjects' matrices as batch names them."""
    pd = pytest.importorskip("pandas")
    (script,) = _code_blocks(DOCS / "tutorials" / "cohort.md", "python")
    derivatives = tmp_path / "derivatives"
    for subject, value in (("sub-01", 3.0), ("sub-02", 5.0)):
        folder = derivatives / subject / "dwi"
        folder.mkdir(parents=True)
        names = ["precentral", "postcentral", "insula"]
        frame = pd.DataFrame([[0, value, 1], [value, 0, 2], [1, 2, 0]], index=names, columns=names)
        frame.to_csv(folder / f"{subject}_space-dwi_meas-count_desc-deterministic_connectome.csv")
    code = script.replace('"/data/study/derivatives/tractlens"', repr(str(derivatives)))
    code = code.replace('"connectome_table.csv"', repr(str(tmp_path / "table.csv")))
    exec(compile(code, "cohort.md", "exec"), {})
    table = pd.read_csv(tmp_path / "table.csv")
    assert len(table) == 6 and set(table.subject) == {"sub-01", "sub-02"}
    row = table[(table.subject == "sub-02") & (table.region_a == "precentral") & (table.region_b == "postcentral")]
    assert row.streamlines.tolist() == [5.0]


# --- no default typed by hand ----------------------------------------------------------------

# Places where a flag is written with its default value on purpose, each with the reason.
ALLOWED = {
    # 0 is a special value whose meaning the sentence explains, not a statement of the default
    ("guide/command-line.md", "--directions 0"),
    # `--gpus 1` is batch's request for one GPU worker (batch's own default is none: CPU workers);
    # track probabilistic's --gpus defaults to 1, which is what the scan matches
    ("guide/cohorts.md", "--gpus 1"),
}


def _flag_defaults() -> dict[str, set[str]]:
    from tractlens_cli import parsers, shown_default

    out: dict[str, set[str]] = {}
    for parser in parsers().values():
        for action in parser._actions:
            value = shown_default(action)
            if value is not None:
                for flag in action.option_strings:
                    out.setdefault(flag, set()).add(value)
    return out


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def typed_defaults() -> list[str]:
    """``--flag VALUE`` where VALUE is a number equal to the flag's default, or any value said to be
    the default; and ``default N`` or ``N is the default`` in prose. Generated pages hold no such text: they are made at
    build time (the ``{default}`` role writes a default from the parser)."""
    defaults = _flag_defaults()
    pages = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]
    found = []
    for page in pages:
        if "_build" in page.parts:
            continue
        name = page.relative_to(DOCS).as_posix() if page.is_relative_to(DOCS) else page.name
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"(--[a-z][a-z0-9-]*)`?,?[ =]`?([-+\w.]+)", text):
            flag, value = match.group(1), match.group(2).rstrip(".")
            said_default = re.match(r"`?\)?,? ?\(?(the |by )?default", text[match.end() : match.end() + 16])
            for default in defaults.get(flag, ()):
                if _same(value, default) or (value == default and said_default):
                    if (name, f"{flag} {value}") not in ALLOWED:
                        line = text[: match.start()].count("\n") + 1
                        found.append(f"{name}:{line}: {match.group(0)}")
        for match in re.finditer(
            r"\bdefaults?\b:? ?\(?`?(-?\d[\d.,e-]*)|\b\d[\d.]* (is|stays) the ([\w']+ ){0,2}default", text
        ):
            line = text[: match.start()].count("\n") + 1
            found.append(f"{name}:{line}: {match.group(0)}")
    return found


def test_no_default_is_typed_by_hand_in_the_docs_or_the_readme():
    found = typed_defaults()
    assert not found, (
        "defaults typed by hand (write {default}`COMMAND --option` or leave the value out):\n" + "\n".join(found)
    )


# --- screenshots ---------------------------------------------------------------------------


def test_every_image_the_docs_show_is_made_by_a_gui_test():
    """Each picture of the pages and the README is listed in docs/screenshots.py with the GUI test
    that saves it (which copies them again from a test run), and that test exists."""
    sys.path.insert(0, str(DOCS))
    import screenshots

    shown = set()
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        if "_build" in page.parts:
            continue
        for target in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            image = (page.parent / target).resolve()
            assert image.is_file(), f"{page.name}: {target}"
            shown.add(image.relative_to(DOCS).as_posix())
    assert shown == set(screenshots.SHOTS), shown ^ set(screenshots.SHOTS)
    for artifact, test in screenshots.SHOTS.values():
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert f"def {name}(" in source, test
        assert f'"{artifact}"' in source, f"{test} does not save {artifact}"
