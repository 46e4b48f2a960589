"""The screenshots of the docs, made by the GUI tests.

The GUI tests save what the window shows into ``tests/_artifacts/`` while they drive it. The docs
use a few of those images, committed under ``docs/_static/screens/`` (and ``docs/screenshot.png``
for the README) so that the site builds without a display. This script copies them again from a
test run; ``--run`` first runs the GUI tests that make them (Xvfb is started by the tests)::

    python docs/screenshots.py --run     # run the tests listed below, then copy
    python docs/screenshots.py           # copy from an earlier run's tests/_artifacts

``tests/test_docs.py`` checks that every image the pages show is listed here, so none is made by
hand.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "_artifacts"

#: docs image -> (the artifact the test writes, the test that writes it)
SHOTS: dict[str, tuple[str, str]] = {
    "screenshot.png": (
        "cli_screenshot.png",
        "tests/gui/test_main_window.py::test_scripted_screenshot_from_the_command_line",
    ),
    "_static/screens/demo.png": (
        "first_impression_newcomer_1_demo.png",
        "tests/gui/test_first_impression.py::test_a_newcomer_gets_from_the_demo_to_streamlines_with_labelled_controls",
    ),
    "_static/screens/tracked.png": (
        "first_impression_newcomer_3_tracked.png",
        "tests/gui/test_first_impression.py::test_a_newcomer_gets_from_the_demo_to_streamlines_with_labelled_controls",
    ),
    "_static/screens/dyads.png": (
        "dyads_bedpostx.png",
        "tests/gui/test_ballstick_gui.py::test_dyads_are_drawn_as_sticks_on_the_slices_and_in_3d",
    ),
    "_static/screens/probabilistic.png": (
        "probabilistic_paths.png",
        "tests/gui/test_probabilistic_gui.py::test_paths_fill_in_on_the_slices_and_in_3d_and_equal_the_pipeline",
    ),
    "_static/screens/connectivity.png": (
        "connectivity_heatmap.png",
        "tests/gui/test_connectivity_gui.py::test_connectome_heatmap_cells_select_streamlines",
    ),
    "_static/screens/presurgical.png": (
        "presurgical.png",
        "tests/gui/test_connectivity_gui.py::test_presurgical_distance_to_lesion",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="run the GUI tests that make the images first")
    parser.add_argument("--artifacts", type=Path, default=ARTIFACTS, help="where the tests saved them")
    args = parser.parse_args(argv)
    if args.run:
        tests = sorted({test for _artifact, test in SHOTS.values()})
        subprocess.run([sys.executable, "-m", "pytest", "-q", *tests], cwd=ROOT, check=True)
    missing = [artifact for artifact, _test in SHOTS.values() if not (args.artifacts / artifact).is_file()]
    if missing:
        print(f"not in {args.artifacts}: {', '.join(missing)}; run with --run", file=sys.stderr)
        return 2
    for image, (artifact, _test) in SHOTS.items():
        target = ROOT / "docs" / image
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.artifacts / artifact, target)
        print(f"docs/{image} <- {artifact}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
