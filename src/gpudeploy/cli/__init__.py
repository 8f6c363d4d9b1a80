"""The ``gpudeploy`` command (``pip install gpudeploy`` / ``pipx install gpudeploy``): an invoke
``Program`` over the task collection of :mod:`gpudeploy.cli.tasks`, so it runs in any folder, with no
``tasks.py`` of its own. In gpudeploy's repository ``invoke TASK`` runs the very same tasks
(tasks.py), plus the lab's.
"""

from __future__ import annotations

from invoke.program import Program

from .. import __version__


def program() -> Program:
    from .tasks import collection

    return Program(namespace=collection(), name="gpudeploy", binary="gpudeploy", version=__version__)


def main() -> None:
    program().run()
