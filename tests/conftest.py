"""What every test process shares: bytecode cached (:mod:`demo.bytecode`).

The suite starts hundreds of interpreters (mgmt-api, the services, agents,
meshctl); where the environment asks for no bytecode, each would compile
everything it imports from source. This process and every child it starts
(the xdist workers, the servers under test) write and read bytecode under
the virtualenv instead.
"""

from __future__ import annotations

import os
import sys

from demo.bytecode import cached

_env = cached(os.environ)
if _env is not None:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = _env["PYTHONPYCACHEPREFIX"]
    sys.pycache_prefix = _env["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False
