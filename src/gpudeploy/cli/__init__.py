"""The ``gpudeploy`` command (``pip install gpudeploy`` / ``pipx install gpudeploy``): an invoke
``Program`` over the task collection of :mod:`gpudeploy.cli.tasks`, so it runs in any folder, with no
``tasks.py`` of its own. In gpudeploy's repository ``invoke TASK`` runs the very same tasks
(tasks.py), plus the lab's.
"""

from __future__ import annotations

import sys
from typing import Any

from invoke.program import Program

from .. import __version__


def program() -> Program:
    from .tasks import collection

    return Program(namespace=collection(), name="gpudeploy", binary="gpudeploy", version=__version__)


def main(argv: Any = None) -> None:
    from .args import BROKEN_PIPE, quiet_stdout

    try:
        try:
            program().run(argv)
        finally:
            sys.stdout.flush()  # `gpudeploy --help | head` too: the tasks answer their own (args.user_errors)
    except BrokenPipeError:
        quiet_stdout()
        sys.exit(BROKEN_PIPE)
