"""The ``gpudeploy`` command (``pip install gpudeploy`` / ``pipx install gpudeploy``): an invoke
``Program`` over the task collection of :mod:`gpudeploy.cli.tasks`, so it runs in any folder, with no
``tasks.py`` of its own. In gpudeploy's repository ``invoke TASK`` runs the very same tasks
(tasks.py), plus the lab's.
"""

from __future__ import annotations

import sys
from typing import Any

from invoke.parser.argument import Argument
from invoke.program import Program

from .. import __version__


class Gpudeploy(Program):
    """invoke's Program with only the program options that mean something for gpudeploy.

    invoke's others set how its ``run()`` runs shell commands (``--dry`` "echo commands instead of
    running", ``--echo``, ``--pty``, ``--warn-only``, ``--hide``, ``--command-timeout``, sudo's
    password, a runtime config file): gpudeploy's tasks run none that way, so ``gpudeploy --dry
    deploy`` deployed for real. They are not options of this program (invoke refuses them as unknown)."""

    def core_args(self) -> list[Argument]:
        return [
            Argument(names=("help", "h"), optional=True, help="show this help, or a task's: gpudeploy TASK --help"),
            Argument(names=("version", "V"), kind=bool, default=False, help="show gpudeploy's version"),
            Argument(names=("list", "l"), optional=True, help="list the tasks"),
            Argument(names=("list-format",), default="flat", help="--list as flat (default), nested or json"),
            Argument(names=("list-depth",), kind=int, default=0, help="--list only the first INT levels"),
            Argument(names=("complete",), kind=bool, default=False, help="print the shell's completions "
                     "of the command line after --"),
            Argument(names=("print-completion-script",), kind=str, default="",
                     help="print the completion script of a shell (bash, zsh or fish), e.g. "
                          "source <(gpudeploy --print-completion-script bash)"),
            # read by invoke's own parsing step
            Argument(names=("debug",), kind=bool, default=False, help="invoke's debug log (how the command "
                     "line was read)"),
            Argument(names=("write-pyc",), kind=bool, default=False, help="let Python write .pyc files"),
        ]

    def update_config(self, merge: bool = True) -> None:
        # invoke's version turns the options left out above into run()/sudo/timeout settings
        if merge:
            self.config.merge()


def program() -> Program:
    from .tasks import collection

    return Gpudeploy(namespace=collection(), name="gpudeploy", binary="gpudeploy", version=__version__)


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
