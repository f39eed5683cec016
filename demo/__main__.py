"""``python -m demo``: see :mod:`demo.stack`.

The orchestrator starts itself again with bytecode cached when the
environment asks for none (:mod:`demo.bytecode`); its children inherit it.
"""

import os
import sys

from demo.bytecode import cached

env = cached(os.environ)
if env is not None:
    os.execve(sys.executable, [sys.executable, "-m", "demo", *sys.argv[1:]], env)  # noqa: S606

from demo.stack import main  # noqa: E402 - only once the bytecode decision is made

sys.exit(main())
