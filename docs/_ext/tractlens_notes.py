"""``tractlens-notes``: a toctree of the feature pages at the top of ``docs/``.

Engineers add a short page named after their feature as ``docs/FEATURE.md``; the pages of the
site itself live in folders (guide/, tutorials/, reference/, ...). This directive lists every
top-level page but the index, so a new feature page is in the site's navigation without editing
the index, and ``sphinx-build -W`` never fails on a page left out of every toctree.
"""

from __future__ import annotations

from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective


class FeatureNotes(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        pages = sorted(name for name in self.env.found_docs if "/" not in name and name != self.env.docname)
        if not pages:
            return [nodes.paragraph(text="No feature notes yet.")]
        # the node the toctree directive makes (built here: the page may be MyST or reST)
        toc = addnodes.toctree()
        toc["parent"] = self.env.docname
        toc["entries"] = [(None, name) for name in pages]
        toc["includefiles"] = pages
        toc["maxdepth"] = 1
        toc["caption"] = None
        toc["glob"] = False
        toc["hidden"] = False
        toc["includehidden"] = False
        toc["numbered"] = 0
        toc["titlesonly"] = False
        wrapper = nodes.compound(classes=["toctree-wrapper"])
        wrapper += toc
        return [wrapper]


def setup(app):
    app.add_directive("tractlens-notes", FeatureNotes)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
