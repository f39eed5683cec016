"""``python -m agent``: the same as ``meshplane-agent``."""

import sys

from agent.cli import main

sys.exit(main())
