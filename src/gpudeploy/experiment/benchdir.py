"""The benchmark client's run folder on the router's host: private to the SSH user, made atomically.

The client runs with HOME, TMPDIR, HF_HOME and XDG_CACHE_HOME in this folder. Under a shared,
world-writable place (``/var/tmp``) another local user could have planted it, or a symlink on its
way, before us (``mkdir -p`` follows symlinks and gives its mode to the last part only), and a
``.pth`` under ``$HOME/.local/lib/python*/site-packages`` there would run as the SSH user. So:

  * the base is ``~/.cache/gpudeploy/bench`` of the SSH user (``benchmark.remote_dir`` names
    another), ``~`` read from the password database, never from the environment;
  * every part of the base's path must be a real directory (no symlink anywhere), owned by root or
    the user, and writable by nobody else unless sticky (``/tmp``-like: others cannot rename what is
    ours); missing parts are made with ``mkdir`` 0700 one at a time (``mkdir`` makes, never follows);
    the base itself must be the user's and 0700;
  * each run's folder is ``mkdtemp`` under it (made atomically, 0700, a name nobody can guess),
    checked again (a directory, the user's, 0700) before the client uses it;
  * anything else is refused with the path, its owner and its mode, and nothing runs.

The script runs as ``python -I`` (isolated: no user site-packages, no PYTHON* variables, not the
current folder on the path), stdlib only, and prints one JSON line: {"path"} or {"error"}.
"""

from __future__ import annotations

import json

from ..errors import RemoteError
from ..model import Host
from ..remote.base import Transport

DEFAULT_BASE = "~/.cache/gpudeploy/bench"

MAKE_RUN_DIR = r"""
import json, os, pwd, stat, sys, tempfile

def done(**doc):
    print(json.dumps(doc))
    sys.exit(0)

base, prefix = sys.argv[1], sys.argv[2]
uid = os.getuid()
if base == "~" or base.startswith("~/"):
    base = pwd.getpwuid(uid).pw_dir + base[1:]
if not os.path.isabs(base):
    done(error=f"{base} is not an absolute path")
base = os.path.normpath(base)

def who(st):
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return f"uid {st.st_uid}"

def check(path, st, last):
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        done(error=f"{path} is a symbolic link (to {os.readlink(path)}); the benchmark folder is made only "
                   "along real directories")
    if not stat.S_ISDIR(st.st_mode):
        done(error=f"{path} is not a directory")
    if st.st_uid not in (0, uid):
        done(error=f"{path} belongs to {who(st)}, not to root or to the SSH user {pwd.getpwuid(uid).pw_name}")
    if mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        done(error=f"{path} is writable by others (mode {mode:04o}); they could swap what is in it")
    if last and (st.st_uid != uid or mode & 0o077):
        done(error=f"{path} must belong to {pwd.getpwuid(uid).pw_name} with mode 0700; it is {who(st)}'s "
                   f"with mode {mode:04o}")

path = "/"
parts = [p for p in base.split("/") if p]
check(path, os.lstat(path), not parts)
for i, part in enumerate(parts):
    path = os.path.join(path, part)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        done(error=f"cannot make {path}: {exc.strerror}")
    check(path, os.lstat(path), i == len(parts) - 1)

run = tempfile.mkdtemp(prefix=prefix, dir=base)
st = os.lstat(run)
if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
    done(error=f"{run} did not come out as a folder of the SSH user with mode 0700")
done(path=run)
"""


def make_argv(python: str, base: str, prefix: str) -> list[str]:
    return [python, "-I", "-c", MAKE_RUN_DIR, base, prefix]


def make_run_dir(remote: Transport, host: Host, base: str, prefix: str) -> str:
    """A fresh private folder for one client run on ``host``; RemoteError (with why) otherwise."""
    res = remote.run(make_argv(host.python, base, prefix), timeout=30, check=False)
    return parse(host.name, base, res.stdout, res.stderr)


def parse(host: str, base: str, stdout: str, stderr: str = "") -> str:
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(host, f"could not make the benchmark folder under {base}: "
                          f"{(stderr or stdout).strip()[-300:] or 'no answer'}") from None
    path = doc.get("path") if isinstance(doc, dict) else None
    if isinstance(path, str) and path.startswith("/") and path.isprintable():
        return path
    why = doc.get("error") if isinstance(doc, dict) else None
    raise RemoteError(host, f"refusing to run the benchmark client: {why or stdout.strip()[-300:]}")
