"""The bundle's program: the ``tractlens`` console script (the window without a command, else the CLI)."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # worker processes of a frozen program re-enter here
    from tractlens.widgets.launcher import main

    sys.exit(main())
