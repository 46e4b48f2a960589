"""What the 3-D view draws over its scene: one labelled colour bar, for the selected coloured
tractogram (else the topmost shown one; none for a hidden or empty layer), as FSLeyes and Slicer
show one for the selected overlay, along the bottom edge; and an orientation marker, a cube
labelled with the patient's sides (R/L, A/P, S/I: RAS+, the world frame of the scene).

Screenshots and the report's first page render the 3-D view, so they show both as well.
"""

from __future__ import annotations

from vtkmodules.vtkRenderingAnnotation import vtkAnnotatedCubeActor

BAR_MARGIN = 0.02  # of the view's width and height, around and between the bars
BAR_HEIGHT = 0.11
BAR_MAX_WIDTH = 0.3
MARKER_VIEWPORT = (0.0, 0.78, 0.2, 1.0)  # top left: the bars are along the bottom
# (face, label) of the orientation cube: +x is the patient's right in RAS+.
CUBE_FACES = (("XPlus", "R"), ("XMinus", "L"), ("YPlus", "A"), ("YMinus", "P"), ("ZPlus", "S"), ("ZMinus", "I"))


BAR_TITLE_PT = 14  # the title and labels in points: legible, never the ~5 px of a squeezed bar
BAR_LABEL_PT = 12
#: What a colouring is called on its bar ("cm" read as centimetres).
SCALAR_WORDS = {
    "cm": "connectivity measure (CM)",
    "weight": "COMMIT weight",
    "length": "length (mm)",
    "lesion_dist_mm": "distance to the lesion (mm)",
    "min_lesion_dist_mm": "closest approach to the lesion (mm)",
}


def colour_bar_title(layer_name: str, color_by: str) -> str:
    return f"{layer_name}: {SCALAR_WORDS.get(color_by, color_by)}"


def show_one_colour_bar(bars, titles: list[str]) -> str | None:
    """Show the bar of ``titles[0]`` (the preferred first), hide every other; its title or None."""
    chosen = next((title for title in titles if title in bars.keys()), None)
    for title in bars.keys():
        bars[title].SetVisibility(title == chosen)
    if chosen is not None:
        layout_colour_bars([bars[chosen]], single=True)
    return chosen


def colour_bar_slots(count: int) -> list[tuple[float, float, float, float]]:
    """``count`` rectangles (x, y, width, height) in normalised view coordinates, side by side
    along the bottom edge, disjoint, as wide as fits (at most :data:`BAR_MAX_WIDTH` each)."""
    if count <= 0:
        return []
    width = min(BAR_MAX_WIDTH, (1.0 - BAR_MARGIN * (count + 1)) / count)
    return [(BAR_MARGIN + i * (width + BAR_MARGIN), BAR_MARGIN, width, BAR_HEIGHT) for i in range(count)]


def layout_colour_bars(bars: list, *, single: bool = False) -> None:
    """Put the colour bars (``vtkScalarBarActor``, in the order shown left to right) into their
    slots: horizontal, with few labels so that narrow bars stay legible. ``single``: one bar, wide,
    its text at fixed point sizes."""
    if single:
        (bar,) = bars
        bar.SetOrientationToHorizontal()
        bar.SetPosition(0.25, BAR_MARGIN)
        bar.SetWidth(0.5)
        bar.SetHeight(0.12)
        bar.SetNumberOfLabels(3)
        bar.SetLabelFormat("%.3g")
        bar.SetUnconstrainedFontSize(True)
        bar.GetTitleTextProperty().SetFontSize(BAR_TITLE_PT)
        bar.GetLabelTextProperty().SetFontSize(BAR_LABEL_PT)
        bar.SetTextPositionToPrecedeScalarBar()
        return
    for bar, (x, y, width, height) in zip(bars, colour_bar_slots(len(bars)), strict=True):
        bar.SetOrientationToHorizontal()
        bar.SetPosition(x, y)
        bar.SetWidth(width)
        bar.SetHeight(height)
        bar.SetNumberOfLabels(2 if width < 0.35 else 5)  # the ends only, when narrow: no labels collide
        bar.SetLabelFormat("%.3g")
        bar.SetUnconstrainedFontSize(False)  # the text fits the bar's box, so it never reaches a neighbour
        bar.SetTextPositionToPrecedeScalarBar()  # labels under the bar, the title above it


def add_orientation_marker(plotter):
    """An anatomical cube in the corner that turns with the camera; returns its actor."""
    cube = vtkAnnotatedCubeActor()
    for face, label in CUBE_FACES:
        getattr(cube, f"Set{face}FaceText")(label)
    cube.SetFaceTextScale(0.6)
    cube.GetCubeProperty().SetColor(0.25, 0.25, 0.3)
    cube.GetTextEdgesProperty().SetColor(0.9, 0.9, 0.9)
    for axis, colour in (("X", (1.0, 0.35, 0.35)), ("Y", (0.35, 1.0, 0.35)), ("Z", (0.45, 0.6, 1.0))):
        for side in ("Plus", "Minus"):
            getattr(cube, f"Get{axis}{side}FaceProperty")().SetColor(*colour)
    plotter.add_orientation_widget(cube, interactive=False, viewport=MARKER_VIEWPORT)
    return cube
