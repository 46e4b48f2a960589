"""The anatomy dialogs: Image ▸ Register to DWI… / to MNI… (the registration's settings, a form
generated from :class:`app.anatomy.RegisterParams`) and ROI ▸ Add atlas region… (an atlas, a
search by name, a side). Both are non-blocking (:meth:`QDialog.open`): on OK they hold what was
chosen and emit ``accepted``; the window's anatomy controller runs the job
(:mod:`widgets.controllers.anatomy`). They compute nothing."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.errors import InputError
from tractlens.app.model import Layer
from tractlens.app.window_words import window_words

from . import dialogs
from .fit_dialog_parts import message_label, submit_buttons
from .params_form import ParamsForm

SIDES = (("both sides", None), ("left", "left"), ("right", "right"))


NO_MASK, MASK_FILE = "none", "a file…"


class RegisterDialog(QDialog):
    """Which image to register onto which, with which brain masks, and how. ``moving`` and
    ``fixed`` are the layers offered (the fixed one ``None`` for the MNI template), ``masks`` the
    layers offered as masks (ROIs, label and scalar images; a file can be chosen too, and for the
    template only a file); after OK :attr:`params`, :attr:`moving_layer`, :attr:`fixed_layer`,
    :attr:`moving_mask` and :attr:`fixed_mask` (None, a mask layer or a file path) hold the choice."""

    def __init__(
        self,
        moving: list[Layer],
        fixed: list[Layer] | None,
        params_type: type,
        parent=None,
        *,
        title="",
        masks: list[Layer] = (),
    ):
        super().__init__(parent)
        self.setObjectName("register_dialog")
        self.setWindowTitle(title or "Register to DWI")
        self.setMinimumWidth(440)
        self._moving, self._fixed = list(moving), list(fixed or [])
        self.params = self.moving_layer = self.fixed_layer = self.moving_mask = self.fixed_mask = None
        self.moving_box = QComboBox()
        self.moving_box.setObjectName("register_moving")
        self.moving_box.addItems([layer.name for layer in self._moving])
        self.fixed_box = QComboBox()
        self.fixed_box.setObjectName("register_fixed")
        self.fixed_box.addItems([layer.name for layer in self._fixed] or ["MNI152 template"])
        self.fixed_box.setEnabled(bool(self._fixed))
        self.moving_mask_box = self._mask_box("register_moving_mask", masks, "image to move")
        self.fixed_mask_box = self._mask_box("register_fixed_mask", masks if fixed else (), "image it goes onto")
        self.form = ParamsForm(params_type)
        self.message = message_label("register_message")
        form = QFormLayout()
        form.addRow("Image to move", self.moving_box)
        form.addRow("Its brain mask", self.moving_mask_box)
        form.addRow("Onto", self.fixed_box)
        form.addRow("Its brain mask", self.fixed_mask_box)
        form.addRow(self.form)
        buttons, self.ok_button = submit_buttons(self, "Register", "register_ok")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    def _mask_box(self, name: str, layers, whose: str) -> QComboBox:
        """None, the open layers, or a file (asked for when chosen)."""
        box = QComboBox()
        box.setObjectName(name)
        box.setToolTip(
            f"Restrict the registration's metric to the brain of the {whose}: an open ROI or image (its voxels "
            "above 0), or a mask file; the image's whole field of view without one"
        )
        box.addItem(NO_MASK, None)
        for layer in layers:
            box.addItem(layer.name, layer)
        box.addItem(MASK_FILE, MASK_FILE)
        box.activated.connect(lambda index, box=box: self._file_chosen(box, index))
        return box

    def _file_chosen(self, box: QComboBox, index: int) -> None:
        if box.itemData(index) != MASK_FILE:
            return
        path = dialogs.open_file(self, "Brain mask", "NIfTI (*.nii.gz *.nii *.mgz);;All files (*)")
        if not path:
            box.setCurrentIndex(0)
            return
        box.insertItem(index, Path(path).name, path)
        box.setItemData(index, path, Qt.ItemDataRole.ToolTipRole)
        box.setCurrentIndex(index)

    def choose(self, moving: Layer) -> None:
        """Pre-select the image to move (the selected layer)."""
        if moving in self._moving:
            self.moving_box.setCurrentIndex(self._moving.index(moving))

    def _say(self, text: str) -> None:
        self.message.setText(text)
        self.adjustSize()  # the message shows whole, however long

    def accept(self) -> None:
        try:
            params = self.form.value()
        except ValueError as exc:
            self._say(window_words(f"Check the settings: {exc}."))
            return
        if not self._moving:
            self._say("Open the image to register first (File ▸ Open…).")
            return
        self.params = params
        self.moving_layer = self._moving[self.moving_box.currentIndex()]
        self.fixed_layer = self._fixed[self.fixed_box.currentIndex()] if self._fixed else None
        if self.moving_layer is self.fixed_layer:
            self._say("Choose two different images.")
            return
        self.moving_mask = self.moving_mask_box.currentData()
        self.fixed_mask = self.fixed_mask_box.currentData()
        super().accept()


class AtlasRegionDialog(QDialog):
    """An atlas region to add as an ROI: the atlas, a search by name, the side. ``find(atlas,
    text, side)`` lists the matching regions as (value, name) (:func:`app.atlases.find_regions`);
    after OK :attr:`atlas`, :attr:`value` and :attr:`region` hold the choice."""

    def __init__(self, atlases: list[str], find, titles: dict[str, str] | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("atlas_region_dialog")
        self.setWindowTitle("Add atlas region")
        self.find = find
        self.atlas = self.value = self.region = None
        self.atlas_box = QComboBox()
        self.atlas_box.setObjectName("atlas_name")
        for name in atlases:
            self.atlas_box.addItem((titles or {}).get(name, name), name)
        self.search = QLineEdit()
        self.search.setObjectName("atlas_search")
        self.search.setPlaceholderText("region name, e.g. precentral")
        self.side_box = QComboBox()
        self.side_box.setObjectName("atlas_side")
        for text, side in SIDES:
            self.side_box.addItem(text, side)
        self.regions = QListWidget()
        self.regions.setObjectName("atlas_regions")
        self.message = message_label("atlas_message")
        form = QFormLayout()
        form.addRow("Atlas", self.atlas_box)
        form.addRow("Search", self.search)
        form.addRow("Side", self.side_box)
        buttons, self.ok_button = submit_buttons(self, "Add ROI", "atlas_ok")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(QLabel("Regions"))
        layout.addWidget(self.regions, 1)
        layout.addWidget(self.message)
        layout.addWidget(buttons)
        self.atlas_box.currentIndexChanged.connect(lambda _i: self.refresh())
        self.side_box.currentIndexChanged.connect(lambda _i: self.refresh())
        self.search.textChanged.connect(lambda _t: self.refresh())
        self.regions.itemDoubleClicked.connect(lambda _item: self.accept())
        self.refresh()

    def refresh(self) -> None:
        """List the regions of the chosen atlas that match the search and side."""
        self.regions.clear()
        atlas = self.atlas_box.currentData()
        if atlas is None:
            return
        try:
            found = self.find(atlas, self.search.text().strip(), self.side_box.currentData())
        except InputError as exc:  # the atlas package is missing or damaged: say so here
            self.message.setText(window_words(str(exc)))
            return
        self.message.setText("" if found else "No region of this atlas matches the search.")
        for value, name in found:
            item = QListWidgetItem(name)
            item.setData(Qt.ItemDataRole.UserRole, int(value))
            self.regions.addItem(item)
        if self.regions.count():
            self.regions.setCurrentRow(0)

    def accept(self) -> None:
        item = self.regions.currentItem()
        if item is None:
            self.message.setText("Choose a region (search by its name).")
            return
        self.atlas = self.atlas_box.currentData()
        self.value = int(item.data(Qt.ItemDataRole.UserRole))
        self.region = item.text()
        super().accept()
