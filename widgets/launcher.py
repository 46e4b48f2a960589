"""The ``tractlens`` console script: the GUI for ``--demo`` and ``view``, else the CLI.

tractlens --demo [--screenshot out.png] [--size 1600x1000] [--exit]
tractlens view FILE... [--tensor-order ...] [--screenshot out.png] [--size WxH] [--exit]
tractlens                      (the empty main window)
tractlens SUBCOMMAND ...       (info, fit-dti, demo-data, ...: see tractlens --help)
"""

from __future__ import annotations

import argparse
import sys

from app import cli

GUI_USAGE = "tractlens [--demo | view FILE...] [--screenshot PNG] [--size WxH] [--exit] [--device DEV]"


def _gui_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tractlens", usage=GUI_USAGE, description="Open the TractLens window.")
    parser.add_argument("--demo", action="store_true", help="open the built-in demo phantom")
    parser.add_argument("files", nargs="*", help="files to open (with the 'view' command)")
    parser.add_argument("--screenshot", help="write a PNG of the window once everything is loaded")
    parser.add_argument("--size", default=None, help="window size WIDTHxHEIGHT, e.g. 1600x1000")
    parser.add_argument("--exit", action="store_true", help="quit after loading (and the screenshot)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for loading with --exit")
    return parser


def is_gui_call(argv: list[str]) -> bool:
    if not argv:
        return True
    if argv[0] == "view":
        return True
    return argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")


def run_gui(argv: list[str]) -> int:
    if argv and argv[0] == "view":
        argv = argv[1:]
    args = _gui_parser().parse_args(argv)
    from PySide6.QtWidgets import QApplication

    from .main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("TractLens")
    window = MainWindow(device=args.device)
    if args.size:
        try:
            width, height = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            print(f"tractlens: error: --size must look like 1600x1000, not {args.size!r}", file=sys.stderr)
            return cli.EXIT_INPUT
        window.resize(width, height)
    window.show()
    if args.demo:
        window.open_demo()
    if args.files:
        window.open_paths(args.files)
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
        path = window.save_screenshot(args.screenshot)
        print(f"screenshot written to {path}")
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
