"""``python -m meshctl``: the same entry point as the ``meshctl`` console script."""

from meshctl.entry import main

main()
