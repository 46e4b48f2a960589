"""``python -m tractlens.app.cli``: the command line without the GUI launcher."""

import sys

from . import main

sys.exit(main())
