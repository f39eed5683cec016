import sys

from injector.cli import main

sys.exit(main())
