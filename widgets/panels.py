"""Side panels: the layer list (visibility, order, opacity, colour map, range, a right-click
menu of what can be done with a layer; ROIs are renamed by a double click or that menu, and
coloured there) and the job panel."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.layers import SOLID
from tractlens.app.model import COLORMAPS, GLYPH_KINDS, GLYPH_SHAPES, ROI_ROLES, SCALAR_KINDS, Document, Layer
from tractlens.app.selection import shown_of

from . import dialogs
from .csd_dialog import FIT_CSD
from .fod_glyphs import add_fod_menu
from .job_panel import JobPanel as JobPanel  # the Jobs dock; here for older imports
from .layer_combo import kind_words, named_with_kind

FIT_BALLSTICK = "Fit ball && sticks (bedpostX)…"  # "&&": a literal ampersand in a menu
FIT_MODEL = "Fit microstructure model…"  # NODDI and the model toolbox (widgets.model_dialog)
FILTER_COMMIT = "Filter with COMMIT…"
FILTER_BY_ROIS = "Filter by ROIs"  # checkable: show only the streamlines that pass the ROIs
SAVE_AS = "Save as…"
SHOW_AS = {"scalar": "Show as labels", "labels": "Show as scalar"}  # the menu entry per layer kind
RENAME = "Rename…"
COLOUR = "Colour…"
ROLE_COLOUR = "Colour of its role"


def ask_name(parent: QWidget, current: str) -> str | None:
    """Ask for a layer's new name (tests replace this function); None: cancelled."""
    return dialogs.text(parent, "Rename", "Name:", current)


def ask_colour(parent: QWidget, current: tuple[float, float, float]) -> tuple[float, float, float] | None:
    """Ask for a colour, RGB 0..1 (tests replace this function); None: cancelled."""
    colour = dialogs.colour(parent, "ROI colour", QColor.fromRgbF(*current))
    return None if colour is None else (colour.redF(), colour.greenF(), colour.blueF())


class LayerPanel(QWidget):
    """Top of the list = top of the stack. Check boxes toggle visibility.

    A right click on a layer opens its menu (:attr:`menu`, shown without blocking):
    for a ``dwi`` layer "Fit ball & sticks (bedpostX)…", which emits
    :attr:`fit_ballstick_requested` with the layer, and "Fit CSD…" (:attr:`fit_csd_requested`);
    for an ``fod`` layer the glyphs' scaling; for a ``tractogram`` layer "Filter with
    COMMIT…", which emits :attr:`commit_requested` with the layer; for an ``roi`` layer
    "Rename…" (also a double click), "Colour…" and "Colour of its role" (undoable edits, like
    removing an ROI); for every layer "Remove". ROIs show their colour beside their name.
    """

    fit_ballstick_requested = Signal(object)  # the dwi layer to fit
    fit_model_requested = Signal(object)  # the dwi layer to fit a microstructure model to
    fit_csd_requested = Signal(object)  # the dwi layer to fit fODFs to (widgets.csd_dialog)
    commit_requested = Signal(object)  # the tractogram layer to filter
    show_as_requested = Signal(object, str)  # a scalar or labels layer, and the kind to show it as
    save_as_requested = Signal(object)  # any layer: write it to a file (widgets.layer_files)

    def __init__(self, document: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.document = document
        self.menu: QMenu | None = None
        self.list = QListWidget()
        self.list.setObjectName("layer_list")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.itemDoubleClicked.connect(self._double_clicked)
        self.opacity = QSlider(Qt.Orientation.Horizontal)
        self.opacity.setRange(0, 100)
        self.colormap = QComboBox()
        self.colormap.addItems(COLORMAPS)
        self.color_by = QComboBox()
        self.vmin = QDoubleSpinBox()
        self.vmax = QDoubleSpinBox()
        for spin in (self.vmin, self.vmax):
            spin.setRange(-1e9, 1e9)
            spin.setDecimals(4)
            spin.setKeyboardTracking(False)
        self.role = QComboBox()
        self.role.addItems(ROI_ROLES)
        self.tubes = QCheckBox("Draw as tubes")
        self.glyph = QComboBox()
        self.glyph.addItems(GLYPH_SHAPES)
        self.glyph_step = QSpinBox()
        self.glyph_step.setRange(1, 16)
        self.glyph_size = QDoubleSpinBox()
        self.glyph_size.setRange(0.1, 5.0)
        self.glyph_size.setSingleStep(0.1)
        # Scalar layers as overlays: values below the threshold let the layers beneath show through.
        self.transparent = QCheckBox("Clear below")  # short: a wider label column would narrow the views
        self.transparent.setObjectName("transparent_below")
        self.transparent.setToolTip("Transparent below: values under the threshold let the layers beneath show through")
        self.threshold = QDoubleSpinBox()
        self.threshold.setObjectName("transparent_threshold")
        self.threshold.setRange(-1e9, 1e9)
        self.threshold.setDecimals(4)
        self.threshold.setKeyboardTracking(False)
        up, down, remove = QPushButton("Up"), QPushButton("Down"), QPushButton("Remove")
        buttons = QHBoxLayout()
        for button in (up, down, remove):
            buttons.addWidget(button)
        form = QFormLayout()
        form.addRow("Opacity", self.opacity)
        form.addRow("Colour map", self.colormap)
        form.addRow("Colour by", self.color_by)
        form.addRow("Min", self.vmin)
        form.addRow("Max", self.vmax)
        form.addRow(self.transparent, self.threshold)
        form.addRow("ROI role", self.role)
        form.addRow("Streamlines", self.tubes)
        form.addRow("Glyphs", self.glyph)
        form.addRow("Every n-th voxel", self.glyph_step)
        form.addRow("Glyph size", self.glyph_size)
        self.form = form
        self.list.setMinimumHeight(6 * self.list.fontMetrics().height() + 8)  # six rows, never 3½
        self.list.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # whole names in the tool tips
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        layout = QVBoxLayout(self)
        layout.addWidget(self.list, 1)  # the list takes the height the form does not need
        layout.addLayout(buttons)
        layout.addLayout(form)
        self._updating = False
        self.list.itemChanged.connect(self._item_changed)
        self.list.currentRowChanged.connect(lambda _row: self._show_properties())
        self.opacity.valueChanged.connect(lambda v: self._edit(opacity=v / 100.0))
        self.colormap.currentTextChanged.connect(lambda name: self._edit(colormap=name))
        self.color_by.currentTextChanged.connect(lambda name: name and self._edit(color_by=name))
        self.tubes.toggled.connect(lambda on: self._edit(tubes=bool(on)))
        self.role.currentTextChanged.connect(self._set_role)
        self.glyph.currentTextChanged.connect(lambda name: self._edit(glyph=name))
        self.glyph_step.valueChanged.connect(lambda v: self._edit(glyph_step=int(v)))
        self.glyph_size.valueChanged.connect(lambda v: self._edit(glyph_size=float(v)))
        self.vmin.valueChanged.connect(lambda v: self._edit(clim=(v, self.vmax.value())))
        self.vmax.valueChanged.connect(lambda v: self._edit(clim=(self.vmin.value(), v)))
        self.transparent.toggled.connect(lambda _on: self._edit_transparency())
        self.threshold.valueChanged.connect(lambda _v: self._edit_transparency())
        up.clicked.connect(lambda: self._move(+1))
        down.clicked.connect(lambda: self._move(-1))
        remove.clicked.connect(lambda: self._remove())
        document.connect(self._on_document)
        self._rebuild()

    def selected_layer(self) -> Layer | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def item_for(self, layer: Layer) -> QListWidgetItem:
        for row in range(self.list.count()):
            if self.list.item(row).data(Qt.ItemDataRole.UserRole) is layer:
                return self.list.item(row)
        raise KeyError(layer.name)

    def _on_document(self, _source, event, **info) -> None:
        if event == "layers":
            self._rebuild()
        elif event == "display":
            self._refresh_item(info["layer"])
            if info["layer"] is self.selected_layer():
                self._show_properties()

    def _rebuild(self) -> None:
        selected = self.selected_layer()
        self._updating = True
        self.list.clear()
        for layer in reversed(self.document.layers):
            item = QListWidgetItem(layer.name)
            item.setData(Qt.ItemDataRole.UserRole, layer)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            self.list.addItem(item)
            self._refresh_item(layer, item)
        self._updating = False
        if selected in self.document.layers:
            self.list.setCurrentItem(self.item_for(selected))
        elif self.list.count():
            self.list.setCurrentRow(0)
        self._show_properties()

    def _refresh_item(self, layer: Layer, item: QListWidgetItem | None = None) -> None:
        item = item or self.item_for(layer)
        self._updating = True
        item.setCheckState(Qt.CheckState.Checked if layer.visible else Qt.CheckState.Unchecked)
        item.setText(named_with_kind(layer))
        if layer.kind == "tractogram":  # what the views show of it, never a count of hidden streamlines
            shown = shown_of(layer)
            count = f"{shown.total:,} streamlines" if not shown.selected else f"{shown.shown:,} of {shown.total:,}"
            item.setText(f"{layer.name}  ({count})")
            item.setToolTip(f"{layer.name}: tractogram, {shown.text}")
        else:
            item.setToolTip(f"{layer.name}: {kind_words(layer.kind)}")
        if layer.kind == "roi":  # a swatch of the colour it is drawn in
            swatch = QPixmap(12, 12)
            swatch.fill(QColor.fromRgbF(*layer.color_rgb()))
            item.setIcon(QIcon(swatch))
        self._updating = False

    def _item_changed(self, item: QListWidgetItem) -> None:
        if self._updating:
            return
        layer = item.data(Qt.ItemDataRole.UserRole)
        layer.set(visible=item.checkState() == Qt.CheckState.Checked)

    def _show_properties(self) -> None:
        layer = self.selected_layer()
        self._updating = True
        enabled = layer is not None
        for widget in (self.opacity, self.colormap, self.vmin, self.vmax, self.color_by):
            widget.setEnabled(enabled)
        self.glyph.setEnabled(layer is not None and layer.kind == "tensor")
        for widget in (self.glyph_step, self.glyph_size):
            widget.setEnabled(layer is not None and layer.kind in GLYPH_KINDS)
        self.tubes.setEnabled(layer is not None and layer.kind == "tractogram")
        overlay = layer is not None and layer.kind in SCALAR_KINDS
        self.transparent.setEnabled(overlay)
        self.threshold.setEnabled(overlay and layer.transparent_below is not None)
        if overlay:
            self.transparent.setChecked(layer.transparent_below is not None)
            # Unset, the threshold offered is 5 % into the display range (an FA map: 0.05, its background).
            lo, hi = layer.clim
            below = layer.transparent_below
            self.threshold.setValue(lo + 0.05 * (hi - lo) if below is None else below)
        self.role.setEnabled(layer is not None and layer.kind == "roi")
        kind = layer.kind if layer is not None else None
        for widget, kinds in (  # only the rows that apply to the selected layer (FSLeyes' way)
            (self.threshold, SCALAR_KINDS),
            (self.role, ("roi",)),
            (self.tubes, ("tractogram",)),
            (self.glyph, ("tensor",)),
            (self.glyph_step, GLYPH_KINDS),
            (self.glyph_size, GLYPH_KINDS),
            (self.color_by, ("tractogram", "tensor")),
            (self.colormap, (*SCALAR_KINDS, "tractogram")),
            (self.vmin, (*SCALAR_KINDS, "tractogram")),
            (self.vmax, (*SCALAR_KINDS, "tractogram")),
        ):
            self.form.setRowVisible(widget, kind in kinds)
        if layer is not None and layer.kind == "roi":
            self.role.setCurrentText(layer.data.role)
        if layer is not None:
            self.tubes.setChecked(bool(layer.tubes))
        if layer is not None:
            self.opacity.setValue(round(layer.opacity * 100))
            scalar = layer.kind in SCALAR_KINDS or (
                layer.kind == "tractogram" and layer.color_by not in ("direction", SOLID)
            )
            self.colormap.setEnabled(scalar)
            self.vmin.setEnabled(scalar)
            self.vmax.setEnabled(scalar)
            self.colormap.setCurrentText(layer.colormap)
            self.vmin.setValue(layer.clim[0])
            self.vmax.setValue(layer.clim[1])
            self.color_by.clear()
            if layer.kind == "tractogram":
                solid = [SOLID] if layer.color else []  # a named bundle's own colour
                self.color_by.addItems(["direction", *solid, *layer.data.streamline_scalars, *layer.data.point_scalars])
            elif layer.kind == "tensor":
                self.color_by.addItems(["direction", "fa"])
                self.glyph.setCurrentText(layer.glyph)
            if layer.kind in GLYPH_KINDS:
                self.glyph_step.setValue(layer.glyph_step)
                self.glyph_size.setValue(layer.glyph_size)
            self.color_by.setCurrentText(layer.color_by)
            self.color_by.setEnabled(layer.kind in ("tractogram", "tensor"))
        self._updating = False

    def _edit(self, **changes) -> None:
        layer = self.selected_layer()
        if layer is not None and not self._updating:
            layer.set(**changes)

    def _edit_transparency(self) -> None:
        """The overlay controls: checked, values below the threshold are transparent."""
        layer = self.selected_layer()
        if layer is None or self._updating or layer.kind not in SCALAR_KINDS:
            return
        self.threshold.setEnabled(self.transparent.isChecked())
        layer.set(transparent_below=float(self.threshold.value()) if self.transparent.isChecked() else None)

    def _set_role(self, role: str) -> None:
        layer = self.selected_layer()
        if layer is not None and layer.kind == "roi" and not self._updating:
            self.document.set_roi_role(layer, role)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        self.list.setCurrentItem(item)
        layer = item.data(Qt.ItemDataRole.UserRole)
        self.menu = QMenu(self)
        self.menu.setObjectName("layer_menu")
        if layer.kind == "dwi":
            fit = self.menu.addAction(FIT_BALLSTICK)
            fit.triggered.connect(lambda *_: self.fit_ballstick_requested.emit(layer))
            self.menu.addAction(FIT_MODEL).triggered.connect(lambda *_: self.fit_model_requested.emit(layer))
            self.menu.addAction(FIT_CSD).triggered.connect(lambda *_: self.fit_csd_requested.emit(layer))
            self.menu.addSeparator()
        if layer.kind == "fod":
            add_fod_menu(self.menu, layer)
        if layer.kind == "tractogram":
            by_rois = self.menu.addAction(FILTER_BY_ROIS)
            by_rois.setCheckable(True)
            by_rois.setChecked(bool(layer.filter_by_rois))
            by_rois.setToolTip("Show only the streamlines that pass this window's seed, target and waypoint ROIs")
            by_rois.toggled.connect(lambda on: layer.set(filter_by_rois=bool(on)))
            commit = self.menu.addAction(FILTER_COMMIT)
            commit.triggered.connect(lambda *_: self.commit_requested.emit(layer))
            self.menu.addSeparator()
        if layer.kind == "roi":
            self.menu.addAction(RENAME).triggered.connect(lambda *_: self.rename(layer))
            self.menu.addAction(COLOUR).triggered.connect(lambda *_: self.choose_colour(layer))
            role_colour = self.menu.addAction(ROLE_COLOUR)
            role_colour.setEnabled(layer.color is not None)
            role_colour.triggered.connect(lambda *_: self.document.set_layer_color(layer, None))
            self.menu.addSeparator()
        if layer.kind in SHOW_AS:  # the loader's guess of scalar image vs label map, overruled
            other = "labels" if layer.kind == "scalar" else "scalar"
            show_as = self.menu.addAction(SHOW_AS[layer.kind])
            show_as.triggered.connect(lambda *_: self.show_as_requested.emit(layer, other))
            self.menu.addSeparator()
        self.menu.addAction(SAVE_AS).triggered.connect(lambda *_: self.save_as_requested.emit(layer))
        self.menu.addAction("Remove").triggered.connect(lambda *_: self._remove(layer))
        self.menu.popup(self.list.viewport().mapToGlobal(pos))

    def _move(self, delta: int) -> None:
        layer = self.selected_layer()
        if layer is not None:
            index = self.document.layers.index(layer)
            self.document.move_layer(layer, index + delta)

    def _remove(self, layer: Layer | None = None) -> None:
        """Remove ``layer`` (default: the selected one) from the document (an ROI undoably)."""
        layer = layer or self.selected_layer()
        if layer in self.document.layers:
            self.document.remove_layer(layer, undoable=layer.kind == "roi")

    def _double_clicked(self, item: QListWidgetItem) -> None:
        layer = item.data(Qt.ItemDataRole.UserRole)
        if layer is not None and layer.kind == "roi":
            self.rename(layer)

    def rename(self, layer: Layer) -> bool:
        """Ask for an ROI's new name and give it (undoable); a name another layer has is refused
        with a message in the window's status bar."""
        name = ask_name(self, layer.name)
        if name is None:
            return False
        try:
            return self.document.rename_layer(layer, name)
        except ValueError as exc:
            self._tell(f"Not renamed: {exc}")
            return False

    def choose_colour(self, layer: Layer) -> bool:
        """Ask for an ROI's colour and give it (undoable)."""
        colour = ask_colour(self, layer.color_rgb())
        return colour is not None and self.document.set_layer_color(layer, colour)

    def _tell(self, text: str) -> None:
        window = self.window()
        bar = getattr(window, "statusBar", None)
        if callable(bar):
            bar().showMessage(text, 10000)
