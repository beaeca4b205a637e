"""``python -m attent.cli ...``: the `attent` command, as its entry point runs it."""

import sys

from .main import main

sys.exit(main())
