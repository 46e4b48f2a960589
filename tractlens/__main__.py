"""``python -m tractlens``: the same as the ``tractlens`` command."""

import sys

from tractlens.widgets.launcher import main

sys.exit(main())
