"""widgets.api.open_window: the main window driven from a script or a notebook."""

from PySide6.QtGui import QImage

from tests.conftest import ARTIFACTS


def test_open_window_loads_in_order_and_saves_a_screenshot(qtbot, demo_dir, tmp_path):
    from tractlens.widgets.api import open_window

    window = open_window(demo_dir / "parcellation.nii.gz", demo_dir / "bundles.trk", device="cpu", size=(1200, 800))
    qtbot.addWidget(window)
    try:
        assert window.errors == []
        assert [(layer.name, layer.kind) for layer in window.document.layers] == [
            ("parcellation", "labels"),
            ("bundles", "tractogram"),
        ]
        assert (window.width(), window.height()) == (1200, 800)
        assert window.display_ready()
        window.set_camera_view("coronal")
        path = window.save_screenshot(tmp_path / "api.png")
        image = QImage(str(path))
        assert (image.width(), image.height()) == (1200, 800)
        (ARTIFACTS / "api_window.png").write_bytes(path.read_bytes())
    finally:
        window.runner.shutdown(10)
        window.close()
