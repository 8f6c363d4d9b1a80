"""Every task's command-line options in one table: the short flag each long option has (the same on
every task, or none), and the numbers each takes, checked while the command line is read.

invoke would give each option the first free letter of its name, task by task, so ``-f`` was
``--force`` on deploy (it skips the memory refusal) and ``--forks`` elsewhere, ``-r`` four different
options, and ``-h`` was ``--host`` (not help) everywhere. Here a short flag is written down or absent:
nothing that skips a safety check or removes something has one, and none takes a letter of the
program's own options (``-h`` help, ``-V`` version, ``-l`` list: cli/__init__.py). No option is
positional either: invoke read ``logs --help`` as the host's name, ``render --help`` as the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.tasks import Task, task

from .args import percent, port_number, positive_int, seconds

# long option (the parameter's name) -> its short flag, on every task that has the option
SHORT = {
    "inventory": "i",
    "host": "H",       # (fabric's -H; -h is help)
    "role": "r",
    "deployment": "d",
    "json": "j",
    "forks": "f",      # (ansible's -f)
    "timeout": "t",
    "out": "o",
    "check": "c",      # deploy --check changes nothing
    "watch": "w",
    "suggest": "s",
    "dry_run": "n",    # experiment --dry-run touches nothing (make -n)
    "user": "u",
    "port": "p",
}
# Options that skip a safety check, remove something or take a service down: long names only, so
# that none is typed by a slip of one letter.
DANGEROUS = frozenset({"force", "purge", "allow_downtime", "no_rolling"})
RESERVED = frozenset({"h", "V", "l"})  # the program's own: --help, --version, --list

# Options that take a number: parsed and checked as the command line is read (a message naming the
# flag, never a ValueError traceback), shown by --help as INT.
NUMBERS: dict[str, Callable[[Any, str], Any]] = {
    "forks": positive_int,
    "port": port_number,
    "timeout": seconds,
    "max_fail_percent": percent,
}


class CheckedArgument(Argument):
    """An option whose value is checked (and converted) by ``check`` as it is read."""

    def __init__(self, check: Callable[[Any, str], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def set_value(self, value: Any, cast: bool = True) -> None:
        self.raw_value = value
        try:
            self._value = self.check(value, f"--{self.names[0]}")
        except Exit as exc:
            raise ParseError(exc.message or f"--{self.names[0]}: {value!r}") from None


class Command(Task[Any]):
    """A gpudeploy task: its options' short flags from :data:`SHORT`, numbers checked (:data:`NUMBERS`)."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        out: list[Argument] = []
        for arg in super().get_arguments(ignore_unknown_help):
            # (a parameter named after a builtin, ``json_``, is the option --json)
            name = (arg.attr_name or arg.name or "").rstrip("_")
            names = tuple(arg.names) + ((SHORT[name],) if name in SHORT else ())
            common: dict[str, Any] = dict(names=names, default=arg.default, help=arg.help, positional=arg.positional,
                          optional=arg.optional, incrementable=arg.incrementable, attr_name=arg.attr_name)
            if name in NUMBERS:
                out.append(CheckedArgument(NUMBERS[name], kind=int, **common))
            else:
                out.append(Argument(kind=arg.kind, **common))
        return out


def command(**kwargs: Any) -> Callable[[Callable[..., Any]], Command]:
    """``@task(...)`` for gpudeploy's tasks: no automatic short flags (:data:`SHORT` gives them), no
    positional arguments (a required option is checked by the task, with a message)."""
    return cast(Callable[[Callable[..., Any]], Command],
                task(klass=Command, auto_shortflags=False, positional=[], **kwargs))
