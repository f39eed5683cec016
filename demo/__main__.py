"""``python -m mgmt_api.demo``: see :mod:`mgmt_api.demo.stack`."""

import sys

from mgmt_api.demo.stack import main

sys.exit(main())
