"""``python -m demo``: see :mod:`demo.stack`."""

import sys

from demo.stack import main

sys.exit(main())
