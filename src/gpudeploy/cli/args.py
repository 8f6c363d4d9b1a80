"""What every task shares: the inventory it reads, the command-line values it checks, and the wrapper
that turns gpudeploy's own errors (and Ctrl-C) into a message and an exit status."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit

from .. import interrupt
from ..controlchars import printable
from ..errors import GpudeployError

DEFAULT_INVENTORY = "inventory/hosts.yml"
INVENTORY_ENV = "GPUDEPLOY_INVENTORY"
INVENTORY_HELP = f"inventory file, e.g. -i site/hosts.yml (default: ${INVENTORY_ENV}, else {DEFAULT_INVENTORY})"
SELECT = {"inventory": INVENTORY_HELP, "host": "only this host (its name in the inventory), e.g. -H node171",
          "role": "only this role, e.g. -r decode (a role file's name also selects its named instances)"}
FORKS_HELP = "hosts at once, e.g. -f 10 (default: min(20 x CPUs, hosts, (open files - 10) / 3), as pyinfra)"
REFUSES = 2  # the exit status of plan and render when deploy would refuse a unit (1: the input has problems)
BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` leaves: the reader went away (plan --json | head)


def inventory_path(value: str | None, *, must_exist: bool = True) -> str:
    """The inventory a task reads: ``--inventory``, else ``$GPUDEPLOY_INVENTORY``, else
    ``inventory/hosts.yml`` in the current folder. A missing file says how to make one."""
    path = value or os.environ.get(INVENTORY_ENV) or DEFAULT_INVENTORY
    path = str(Path(path) / "hosts.yml") if Path(path).is_dir() else path  # a folder: its hosts.yml (inventory_file)
    if must_exist and not Path(path).is_file():
        source = "--inventory" if value else f"${INVENTORY_ENV}" if os.environ.get(INVENTORY_ENV) else "the default"
        raise Exit(f"gpudeploy: no inventory at {path} ({source}); `gpudeploy init --host ADDRESS` writes one from "
                   f"the hosts' own facts, or name yours with --inventory PATH or ${INVENTORY_ENV}", code=1)
    return path


def positive_int(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise Exit(f"gpudeploy: {flag} takes a whole number of 1 or more, not {value!r}", code=1)
    return int(value)


def port_number(value: str | None, flag: str) -> int | None:
    number = positive_int(value, flag)
    if number is not None and number > 65535:
        raise Exit(f"gpudeploy: {flag} takes a port number (1-65535), not {value!r}", code=1)
    return number


def percent(value: str | None, flag: str) -> float:
    if value is None:
        return 0.0
    try:
        number = float(str(value).rstrip("%"))
    except ValueError:
        raise Exit(f"gpudeploy: {flag} takes a percentage (0-100), not {value!r}", code=1) from None
    if not 0 <= number <= 100:
        raise Exit(f"gpudeploy: {flag} takes a percentage (0-100), not {value!r}", code=1)
    return number


def seconds(value: str | None, flag: str) -> float | None:
    """A positive number of seconds from the command line (None when not given)."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise Exit(f"gpudeploy: {flag} takes a number of seconds, not {value!r}", code=1) from None
    if not 0 < number < float("inf"):
        raise Exit(f"gpudeploy: {flag} must be more than 0 seconds, got {value!r}", code=1)
    return number


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn gpudeploy's own errors into a message and exit status 1, never a traceback; a reader
    that went away (``plan --json | head``) into a quiet exit 141; and refuse invoke's ``--dry``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..fanout import raise_open_files  # (here, not at import: see cli/tasks.py)

        refuse_dry_run(args[0] if args else None)
        raise_open_files()
        _freeze_at_exit()
        interrupt.install()  # Ctrl-C always ends the command within interrupt.GRACE_S
        try:
            try:
                return fn(*args, **kwargs)
            finally:
                sys.stdout.flush()  # here, where a closed pipe can still be answered
        except BrokenPipeError:
            quiet_stdout()
            raise Exit(code=BROKEN_PIPE) from None
        except GpudeployError as exc:
            raise Exit(f"gpudeploy: {printable(str(exc), lines=True)}", code=1) from None  # a host's stderr in it
        except KeyboardInterrupt:
            print("gpudeploy: interrupted", file=sys.stderr)
            interrupt.leave(130)  # never waits for worker threads still on a host

    return wrapper


def refuse_dry_run(c: Any) -> None:
    """invoke's ``--dry`` (or ``run.dry`` in an invoke config file) only echoes the shell commands a
    task runs through invoke, and gpudeploy's run none that way: ``invoke --dry deploy`` deployed for
    real. The ``gpudeploy`` command has no --dry; ``invoke`` in the repository stops here."""
    try:
        dry = bool(c.config.run.dry)
    except AttributeError:  # not an invoke Context (a test calling the body)
        return
    if dry:
        raise Exit("gpudeploy: invoke's --dry (echo shell commands instead of running them) does not apply to "
                   "gpudeploy's tasks, which would run for real: nothing was done. `deploy --check` shows what "
                   "would change without changing it, `plan` what would run where.", code=1)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still buffered
    does not fail again on the closed pipe (the recipe of Python's signal documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


_frozen_at_exit = False


def _freeze_at_exit() -> None:
    """At exit, move every object into gc's permanent generation (after the other exit handlers,
    which were registered later and run first). The interpreter's last collection then skips
    what the command's imports made: it walked them for 35-50 ms after each command's report, a
    tenth of a redeploy at one host (issue 26). Every exit handler still runs and objects are still
    freed by their reference counts; only garbage left in reference cycles at exit is not collected
    (gpudeploy closes its files, connections and stores before it returns)."""
    global _frozen_at_exit
    if not _frozen_at_exit:
        _frozen_at_exit = True
        atexit.register(gc.freeze)


def set_forks(value: int | None) -> None:
    """--forks N: how many hosts at once (``fanout.set_forks``, imported only by a task that runs)."""
    from ..fanout import set_forks as set_fanout_forks

    set_fanout_forks(value)


def calibration() -> Any:
    """The memory figures earlier runs measured (plan/calibrate.py), loaded only by tasks that plan memory."""
    from ..plan.calibrate import CalibrationStore
    from ..plan.memcheck import DEFAULT_STORE

    return CalibrationStore(DEFAULT_STORE)
