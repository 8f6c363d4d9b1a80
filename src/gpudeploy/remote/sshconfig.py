"""Which ssh_config files both transports read: OpenSSH's own (``~/.ssh/config``, with ``~`` the
password database's home as ssh takes it, then ``/etc/ssh/ssh_config``), or the one file named by
``GPUDEPLOY_SSH_CONFIG`` (``ssh -F``: then neither of those), for the OpenSSH client and fabric
alike. No paramiko here (``invoke status`` imports this).
"""

from __future__ import annotations

import os
import pwd

ENV = "GPUDEPLOY_SSH_CONFIG"
SYSTEM_FILE = "/etc/ssh/ssh_config"


def override() -> str | None:
    """The one ssh_config file to read instead of the default ones, if set."""
    return os.environ.get(ENV) or None


def user_file() -> str:
    return os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".ssh", "config")


def files() -> list[str]:
    """The top-level files ssh reads, in its order."""
    one = override()
    return [one] if one else [user_file(), SYSTEM_FILE]


def openssh_args() -> list[str]:
    """What every ssh gpudeploy runs (each hop's too) is given to read the same files."""
    one = override()
    return ["-F", one] if one else []
