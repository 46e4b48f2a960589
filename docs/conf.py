"""Sphinx configuration of the TractLens documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (the ``docs`` extra).
The CLI reference and the performance pages are generated from the code and the benchmark
results at build time (``docs/_ext``); nothing is fetched from the network.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import tractlens  # noqa: E402

project = "TractLens"
author = "The TractLens developers"
copyright = "TractLens developers, BSD-3-Clause"
version = release = tractlens.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
    "tractlens_cli",
    "tractlens_bench",
    "tractlens_notes",
]
# Intersphinx would fetch inventories from the network at every build: not used (CI is offline).

# Option names stay as typed: no "--" turned into an en dash.
smartquotes = False

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "_ext"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The Python API: autodoc + numpydoc, documented objects listed by hand in reference/api.md.
autodoc_typehints = "none"  # numpydoc's Parameters section states types and units
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"TractLens {release}"
html_logo = (
    str(HERE.parent / "resources" / "tractlens.svg") if (HERE.parent / "resources" / "tractlens.svg").exists() else None
)
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 7,
}
html_last_updated_fmt = None
