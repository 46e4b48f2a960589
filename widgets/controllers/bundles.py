"""Track ▸ Named bundles…: the dialog (:mod:`widgets.bundles_dialog`), the job on the window's runner
(progress per bundle and Cancel in the Jobs panel; :func:`app.bundles.run_bundles`) and the
results as layers named after the bundles in their colours (:func:`app.bundles.layers.bundle_layers`),
which the Presurgical panel measures and the report lists like any tractogram. This module is
about widgets: it decides nothing."""

from __future__ import annotations

from ..bundles_dialog import BundlesDialog
from .menus import add_action


class BundlesController:
    """The named-bundles action of ``window`` (a :class:`~tractlens.widgets.main_window.MainWindow`)."""

    def __init__(self, window):
        self.window = window
        self.document = window.document
        self.runner = window.runner
        self.dialog: BundlesDialog | None = None

    def build(self, track_menu) -> None:
        add_action(self.window, track_menu, "&Named bundles…", self.open_dialog)

    def _mni_registration_folder(self) -> str:
        """The folder of the document's last registration to MNI (the dialog's first guess)."""
        folders = [r.folder for r in self.document.registrations.values() if r.template == "mni" and r.folder]
        return folders[-1] if folders else ""

    def _open_samples(self) -> tuple[str, str] | None:
        """The bedpostX folder of an open dyads layer, if any (the dialog's first guess)."""
        for layer in reversed(self.document.layers):
            path = getattr(getattr(layer.data, "samples", None), "path", "") if layer.kind == "dyads" else ""
            if path:
                return ("samples", str(path))
        return None

    def open_dialog(self) -> BundlesDialog:
        """The dialog (non-blocking); its OK starts the job."""
        from .anatomy import _show

        if self.dialog is not None:
            self.dialog.deleteLater()
        dialog = BundlesDialog(self.window, registration=self._mni_registration_folder(), source=self._open_samples())
        dialog.accepted.connect(lambda: self.track(dialog))
        self.dialog = dialog
        _show(dialog)
        return dialog

    def track(self, dialog: BundlesDialog) -> int:
        """Track the dialog's bundles on a worker; when done each bundle with streamlines joins the
        document as a layer, and those that missed are named in the status bar. The job id."""
        from tractlens.app.bundles import run_bundles
        from tractlens.app.bundles.layers import bundle_layers, problems_text
        from tractlens.app.params import ProbParams, gui_preset

        keyword, folder = dialog.source
        names, params, registration, output = dialog.names, dialog.params, dialog.registration, dialog.output
        device = self.window.device

        # the Probabilistic panel's starting samples per seed voxel (app.params.GUI_PRESETS): a first look
        prob = ProbParams(n_samples=gui_preset(ProbParams, "n_samples"))

        def job(ctx):
            return run_bundles(registration=registration, output=output, names=names, params=params, device=device,
                               context=ctx, prob_params=prob, **{keyword: folder})  # fmt: skip

        def done(result) -> None:
            layers = bundle_layers(result)
            for layer in layers:
                self.document.add_layer(layer)
            if layers:
                self.window.select_layer(layers[-1])
                self.window.first_steps.tracked_elsewhere()
            problems = problems_text(result)
            text = f"Named bundles: {len(layers)} of {len(result.bundles)} tracked into {result.output}"
            if layers and self.window.view3d.plane_mode == "opaque":
                # opaque cursor planes hide most of a bundle in 3-D: let it show through them
                self.window.view_controls.set_plane_mode("translucent")
                text += "; 3-D slice planes made translucent (View ▸ Slice planes in 3-D)"
            self.window.statusBar().showMessage(text + (f" (not found: {problems})" if problems else ""), 30000)

        return self.runner.submit(f"named bundles ({len(names)})", job, on_done=done, on_error=self.window.report_error)
