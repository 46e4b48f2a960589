"""A TractLens window that draws ROIs like a user, waits for the autosave, then waits to be killed.

Run by ``tests/gui/test_recovery.py`` as ``python -m tests.gui.crash_child OUT.npz`` with the
recovery folder in the environment. It prints ``READY`` once an autosave holding every edit has
been written, and the masks it drew are in ``OUT.npz`` by then.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from tractlens.app.model import Layer, Volume
from tractlens.widgets.main_window import MainWindow


def drag(view, voxels) -> None:
    points = [view.widget_point_of_voxel(v) for v in voxels]
    qpoints = [QPoint(int(p.x()), int(p.y())) for p in points]
    QTest.mousePress(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, qpoints[0])
    for point in qpoints[1:]:
        QTest.mouseMove(view, point)
    QTest.mouseRelease(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, qpoints[-1])


def wait_until(app, condition, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("condition not met")
        app.processEvents()
        time.sleep(0.01)


def main(out: str) -> None:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(device="cpu", autosave_s=0.3, restore="no")
    window.resize(1200, 800)
    window.show()
    wait_until(app, window.isVisible)
    for _ in range(20):
        app.processEvents()
    data = np.random.default_rng(7).uniform(size=(40, 30, 12)).astype(np.float32)
    window.document.add_layer(Layer("anat", Volume("anat", data, np.diag([2.0, 2.0, 2.0, 1.0])), "scalar"))
    for _ in range(10):
        app.processEvents()
    axial = window.views["axial"]
    z = int(window.document.cursor[2])

    seed = window.new_roi()  # a seed painted with the brush
    window.radius_box.setValue(2)
    drag(axial, [(8, 12, z), (20, 12, z)])
    exclusion = window.new_roi()  # an exclusion region: a rectangle
    window.document.set_roi_role(exclusion, "exclusion")
    window.set_tool("rectangle")
    drag(axial, [(25, 5, z), (30, 9, z)])
    target = window.new_roi()  # a target sphere, placed by a click then moved
    window.document.set_roi_role(target, "target")
    window.document.set_roi_shape(target, {"kind": "sphere", "centre": (30.0, 20.0, float(z)), "radius": 2.0})
    window.document.set_roi_shape(target, {"kind": "sphere", "centre": (31.0, 21.0, float(z)), "radius": 3.0})
    for _ in range(10):
        app.processEvents()
    assert seed.data.mask.any() and exclusion.data.mask.any() and target.data.mask.any()

    masks = {layer.name: layer.data.mask.copy() for layer in (seed, exclusion, target)}
    roles = {layer.name: layer.data.role for layer in (seed, exclusion, target)}
    tmp = out + ".tmp.npz"
    np.savez(tmp, anat=data, **{f"mask:{k}": v for k, v in masks.items()}, roles=np.array(list(roles.items())))
    os.replace(tmp, out)

    # An autosave whose snapshot was taken after the last edit holds all of it (written then, or
    # found unchanged because an earlier one already had it).
    saver = window.autosave.saver
    edited = time.monotonic()
    wait_until(app, lambda: saver.snapshot_time > edited and not saver.busy and saver.writes > 0)
    print("READY", window.autosave.store.folder, flush=True)
    while True:  # a user who goes on working until the process is killed
        app.processEvents()
        time.sleep(0.02)


if __name__ == "__main__":
    main(sys.argv[1])
