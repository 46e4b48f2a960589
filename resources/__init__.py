"""Files shipped with the program: icons, style sheet, presets."""

from pathlib import Path

RESOURCES = Path(__file__).parent
