"""``python -m demo``: see :mod:`demo.stack`.

With ``PYTHONDONTWRITEBYTECODE`` set, every process of the stack (a dozen
interpreters) would compile each module it imports from source at every
start: about 20 CPU-seconds for mgmt-api alone, the largest part of a first
start. The orchestrator then starts itself again with bytecode written under
the environment's own prefix instead (``.venv/pycache``, through
``PYTHONPYCACHEPREFIX``, which its children inherit), so the source tree
still gets no ``__pycache__``. A ``PYTHONPYCACHEPREFIX`` already set is kept.
"""

import os
import sys
from pathlib import Path

if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(sys.prefix) / "pycache")
    os.execve(sys.executable, [sys.executable, "-m", "demo", *sys.argv[1:]], env)  # noqa: S606

from demo.stack import main

sys.exit(main())
