"""``python -m gpudeploy.cli``: the ``gpudeploy`` command (where the console script is not on PATH)."""

from . import main

main()
