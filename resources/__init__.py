"""Files shipped with the program, and where they are once installed.

Exactly these are shipped (:data:`FILES`):

- ``tractlens.svg``: the application icon (a fibre bundle coloured by direction, under a lens);
- ``icons/<name>.svg``: the tool-bar icons, one set on a 24 × 24 grid with 2-px round strokes
  in two colours (slate outline, blue accent), named after the actions in :data:`TOOLBAR_ICONS`;
- ``tractlens.desktop``: the freedesktop.org desktop entry (``Exec=tractlens view %F``,
  ``Icon=tractlens``), to copy to ``~/.local/share/applications`` with the icon installed
  as ``tractlens`` in an icon theme (see ``packaging/README.md``);
- ``bundles/protocols.json``: the named-bundle protocols (seed, target, exclusion and stop regions
  in MNI mm after XTRACT, with their citations and ``protocols_version``; :mod:`app.bundles`).
"""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).parent

APP_ICON = "tractlens.svg"
DESKTOP_ENTRY = "tractlens.desktop"
#: Tool-bar icons by action: files, view, tracking and jobs, editing, then the ROI tools.
TOOLBAR_ICONS = (
    "open",
    "open-folder",
    "demo",
    "open-session",
    "save-session",
    "screenshot",
    "report",
    "reset-camera",
    "track",
    "cancel",
    "undo",
    "redo",
    "new-roi",
    "navigate",
    "brush",
    "eraser",
    "rectangle",
    "polygon",
    "fill",
    "sphere",
    "box",
)
BUNDLE_PROTOCOLS = "bundles/protocols.json"
#: Every shipped file, relative to :data:`RESOURCES`.
FILES = (APP_ICON, DESKTOP_ENTRY, BUNDLE_PROTOCOLS, *(f"icons/{name}.svg" for name in TOOLBAR_ICONS))


def path(name: str) -> Path:
    """The installed path of the shipped file ``name`` (one of :data:`FILES`, e.g. ``"tractlens.svg"``)."""
    if name not in FILES:
        raise FileNotFoundError(f"{name!r} is not a shipped resource; these are: {', '.join(FILES)}")
    return RESOURCES / name


def icon_path(name: str) -> Path:
    """The SVG of the tool-bar icon ``name`` (one of :data:`TOOLBAR_ICONS`, e.g. ``"brush"``)."""
    if name not in TOOLBAR_ICONS:
        raise FileNotFoundError(f"no tool-bar icon {name!r}; these exist: {', '.join(TOOLBAR_ICONS)}")
    return RESOURCES / "icons" / f"{name}.svg"
