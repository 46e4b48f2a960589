"""The ``tractlens`` console script: the GUI for ``--demo`` and ``view``, else the CLI.

tractlens --demo [--screenshot out.png] [--size 1600x1000] [--exit]
tractlens view FILE... [--bval F --bvec F] [--tensor-order ...] [--screenshot out.png] [--size WxH] [--exit]
tractlens view DICOM_DIR [--series N] [--screenshot out.png] [--exit]
tractlens --session FILE.tractlens [--screenshot out.png] [--exit]
tractlens report SESSION -o report.pdf [--no-png] [--margin MM] [--size WxH]
tractlens                      (the empty main window)
tractlens SUBCOMMAND ...       (info, fit-dti, demo-data, ...: see tractlens --help)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tractlens.app import cli
from tractlens.app.cli.options import add_params, params_from_args
from tractlens.app.params import ReportParams

GUI_USAGE = (
    "tractlens [--demo | view FILE... [--bval F --bvec F] [--series N] | --session FILE] [--screenshot PNG] [--size WxH] [--exit] [--device DEV] "
    "[--autosave SECONDS] [--restore ask|yes|no]"
)


def _gui_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tractlens", usage=GUI_USAGE, description="Open the TractLens window.")
    parser.add_argument("--demo", action="store_true", help="open the built-in demo phantom")
    parser.add_argument("--session", help="reopen a saved session (.tractlens)")
    parser.add_argument("files", nargs="*", help="files to open (with the 'view' command)")
    parser.add_argument("--bval", help="FSL bval file of a diffusion series opened with 'view' (default: beside it)")
    parser.add_argument("--bvec", help="FSL bvec file of a diffusion series opened with 'view' (default: beside it)")
    parser.add_argument(
        "--series",
        metavar="N",
        help="the diffusion series of a DICOM folder opened with 'view' (its number, description or UID): "
        "needed when the folder holds several",
    )
    parser.add_argument("--screenshot", help="write a PNG of the window once everything is loaded")
    parser.add_argument("--size", default=None, help="window size WIDTHxHEIGHT, e.g. 1600x1000")
    parser.add_argument("--exit", action="store_true", help="quit after loading (and the screenshot)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for loading with --exit")
    parser.add_argument(
        "--autosave",
        type=float,
        metavar="SECONDS",
        help="autosave the work every SECONDS to the recovery folder (0: off; default: the saved setting, 30)",
    )
    parser.add_argument(
        "--restore",
        choices=("ask", "yes", "no"),
        default=None,
        help="after a crash, restore the autosaved work: ask (default), yes, or no (keep it for a later start); "
        "with --exit or --screenshot nobody is asked: the default is then no",
    )
    return parser


def is_gui_call(argv: list[str]) -> bool:
    if not argv:
        return True
    if argv[0] in ("view", "report"):
        return True
    return argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")


def _report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tractlens report",
        description="Write the report of a saved session: a PDF (and a PNG per page) with the 3-D view and the "
        "three planes, the distance of every tractogram to the lesion within the safety margin, and the "
        "parameters and provenance of every result. Renders the window (needs a display; use xvfb-run on a "
        "server).",
    )
    parser.add_argument("session", help="a session saved by File > Save session (.tractlens)")
    parser.add_argument("-o", "--output", required=True, help="report PDF")
    add_params(parser, ReportParams)
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    return parser


def _window(args, *, scripted: bool):
    """A QApplication and a shown main window of the requested size (None, status on a bad size).

    ``scripted``: a run nobody watches (``--exit``, ``--screenshot``, ``report``): no dialog is
    shown (:mod:`widgets.dialogs`), an earlier crash's autosave is kept for the next interactive
    start (one line on stderr says so), and nothing is autosaved unless ``--autosave`` asks."""
    from PySide6.QtWidgets import QApplication

    from . import dialogs
    from .controllers.menus import app_icon
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("TractLens")
    app.setWindowIcon(app_icon())
    if scripted:
        dialogs.set_scripted(True)
    autosave = getattr(args, "autosave", None)
    restore = getattr(args, "restore", None) or ("no" if scripted else "ask")
    window = MainWindow(
        device=args.device, autosave_s=0 if scripted and autosave is None else autosave, restore=restore
    )
    if args.size:
        try:
            width, height = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            print(f"tractlens: error: --size must look like 1600x1000, not {args.size!r}", file=sys.stderr)
            return app, None
        window.resize(width, height)
    window.show()
    return app, window


def run_report(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    report = params_from_args(ReportParams, args)
    args.size = report.size
    from tractlens.app.errors import InputError
    from tractlens.app.session import load_session

    try:
        session = load_session(args.session)
    except InputError as exc:
        print(f"tractlens report: error: {exc}", file=sys.stderr)
        return cli.EXIT_INPUT
    app, window = _window(args, scripted=True)
    if window is None:
        return cli.EXIT_INPUT
    from .report import export_report
    from .session_io import apply_session

    apply_session(window, session)
    for _ in range(10):  # lay out and render once
        app.processEvents()
    options = {} if report.margin_mm is None else {"margin_mm": report.margin_mm}
    try:
        files = export_report(window, args.output, png=report.png, **options)
    except (OSError, InputError) as exc:
        print(f"tractlens report: error: cannot write the report ({exc})", file=sys.stderr)
        return cli.EXIT_INPUT
    finally:
        window.close()
    print("report written: " + ", ".join(str(f) for f in files))
    return cli.EXIT_OK


def run_gui(argv: list[str]) -> int:
    if argv and argv[0] == "report":
        return run_report(argv[1:])
    if argv and argv[0] == "view":
        argv = argv[1:]
    parser = _gui_parser()
    args = parser.parse_args(argv)
    if (args.bval is None) != (args.bvec is None) or (args.bval and not args.files):
        parser.error(
            "--bval and --bvec go together, with the diffusion series to view: tractlens view DWI --bval F --bvec F"
        )
    if args.series is not None and not any(Path(path).is_dir() for path in args.files):
        parser.error("--series chooses a series of a DICOM folder: tractlens view DICOM_DIR --series N")
    app, window = _window(args, scripted=bool(args.exit or args.screenshot))
    if window is None:
        return cli.EXIT_INPUT
    if args.session:
        from tractlens.app.errors import InputError

        from .session_io import open_window_session

        try:
            open_window_session(window, args.session)
        except InputError as exc:
            print(f"tractlens: error: {exc}", file=sys.stderr)
            window.close()
            return cli.EXIT_INPUT
    if args.demo:
        window.open_demo()
    if args.files:
        dicom = [path for path in args.files if window.dicom.handles(path)]
        for folder in dicom:  # its series, converted; several diffusion series need --series
            window.dicom.load(Path(folder), args.series)
        gradients = (args.bval, args.bvec) if args.bval else None
        window.files.open_paths([path for path in args.files if path not in dicom], gradients=gradients)
    if not (args.screenshot or args.exit):
        return app.exec()
    if not window.wait_for_jobs(args.timeout):
        print("tractlens: error: loading did not finish in time", file=sys.stderr)
        return cli.EXIT_INTERNAL
    for _ in range(5):  # let the views lay out and render once
        app.processEvents()
    status = cli.EXIT_OK
    if window.errors:
        for message in window.errors:
            print(f"tractlens: error: {message}", file=sys.stderr)
        status = cli.EXIT_INPUT
    if args.screenshot:
        window.view3d.request_render()
        app.processEvents()
        from tractlens.app.errors import InputError

        try:
            path = window.save_screenshot(args.screenshot)
            print(f"screenshot written to {path}")
        except (OSError, InputError) as exc:
            print(f"tractlens: error: cannot write the screenshot ({exc})", file=sys.stderr)
            status = cli.EXIT_INPUT
    if args.exit:
        window.close()
        return status
    return app.exec()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if is_gui_call(argv):
        return run_gui(argv)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
