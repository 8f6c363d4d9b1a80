"""One SSH connection per host (fabric/paramiko), with host keys checked and errors made plain.

Fabric accepts unknown host keys by default (AutoAddPolicy); gpudeploy never does: a key must be
in the inventory's known_hosts file (or ~/.ssh/known_hosts).
"""

from __future__ import annotations

import json
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fabric
import paramiko

from ..errors import HostUnreachable, RemoteError
from ..facts import remote_probe
from ..model import Host

PROBE_SOURCE = Path(remote_probe.__file__).read_text()


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


class Remote:
    """A connected host. Commands are argv lists, quoted here; nothing is concatenated elsewhere."""

    def __init__(self, host: Host) -> None:
        self.host = host
        key = host.ssh.key
        self.conn = fabric.Connection(
            host.address, user=host.ssh.user, port=host.ssh.port,
            connect_timeout=int(host.ssh.connect_timeout_s),
            connect_kwargs={"key_filename": [key] if key else None, "look_for_keys": key is None,
                            "allow_agent": key is None, "banner_timeout": host.ssh.connect_timeout_s,
                            "auth_timeout": host.ssh.connect_timeout_s},
        )
        client = self.conn.client
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if host.ssh.known_hosts:
            try:
                client.load_host_keys(host.ssh.known_hosts)
            except OSError as exc:
                raise HostUnreachable(host.name, f"cannot read known_hosts {host.ssh.known_hosts}: {exc}") from None
        else:
            client.load_system_host_keys()
        self._lock = threading.Lock()

    def __enter__(self) -> Remote:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        where = f"{self.host.ssh.user}@{self.host.address}:{self.host.ssh.port}"
        try:
            self.conn.open()
            # Keepalives make a half-open connection fail instead of hanging a read forever.
            self.conn.transport.set_keepalive(2)
        except paramiko.BadHostKeyException:
            raise HostUnreachable(self.host.name, f"host key of {where} does NOT match known_hosts "
                                  f"({self.host.ssh.known_hosts or '~/.ssh/known_hosts'}); refusing to connect"
                                  ) from None
        except paramiko.AuthenticationException as exc:
            raise HostUnreachable(self.host.name, f"ssh authentication to {where} failed: {exc}") from None
        except paramiko.SSHException as exc:
            msg = str(exc)
            if "not found in known_hosts" in msg:
                msg = (f"{where} is not in known_hosts ({self.host.ssh.known_hosts or '~/.ssh/known_hosts'}); "
                       "add its host key first (host keys are always checked)")
            raise HostUnreachable(self.host.name, f"ssh to {where} failed: {msg}") from None
        except TimeoutError:
            raise HostUnreachable(self.host.name, f"ssh to {where} timed out") from None
        except OSError as exc:
            raise HostUnreachable(self.host.name, f"cannot reach {where}: {exc.strerror or exc}") from None

    def close(self) -> None:
        self.conn.close()

    def _session(self) -> paramiko.Channel:
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise HostUnreachable(self.host.name, "the ssh connection was lost")
        try:
            chan: paramiko.Channel = transport.open_session(timeout=self.host.ssh.connect_timeout_s)
            return chan
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostUnreachable(self.host.name, f"the ssh connection was lost: {exc}") from None

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        """Run ``argv`` (quoted with shlex) and wait for it; RemoteError if it fails and ``check``."""
        command = " ".join(shlex.quote(a) for a in argv)
        chan = self._session()
        chan.settimeout(timeout)
        try:
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            # stderr of our commands is small; paramiko buffers it while stdout is drained.
            out = chan.makefile("rb").read()
            err = chan.makefile_stderr("rb").read()
            rc = chan.recv_exit_status()
        except TimeoutError:
            raise RemoteError(self.host.name, f"`{command[:120]}` did not finish within {timeout:g} s") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostUnreachable(self.host.name, f"the ssh connection was lost: {exc}") from None
        finally:
            chan.close()
        result = Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and rc != 0:
            raise RemoteError(self.host.name, f"`{command[:200]}` failed (exit {rc}): "
                              f"{(result.stderr or result.stdout).strip()[-500:]}")
        return result

    def stream(self, argv: list[str]) -> paramiko.Channel:
        """Start a long-running command; the caller reads lines from the returned channel."""
        chan = self._session()
        chan.exec_command(" ".join(shlex.quote(a) for a in argv))
        return chan

    def probe(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One round trip that returns every fact (see facts/remote_probe.py)."""
        res = self.run([self.host.python if self.host.python else "python3", "-c", PROBE_SOURCE,
                        json.dumps(spec)], timeout=60)
        try:
            data: dict[str, Any] = json.loads(res.stdout)
        except ValueError:
            raise RemoteError(self.host.name, f"host probe returned no JSON: {res.stdout[:200]!r}") from None
        return data

    def put(self, path: str, data: bytes, mode: int) -> None:
        """Write ``path`` atomically in one round trip: a temp file in the same folder, created
        0600 (umask) so a secret is never readable by others, mode set, then renamed over."""
        folder, name = path.rsplit("/", 1)
        script = 'umask 077 && mkdir -p "$1" && cat > "$2" && chmod "$4" "$2" && mv -f "$2" "$3"'
        self.run(["sh", "-c", script, "put", folder, f"{folder}/.{name}.gpudeploy-tmp", path, f"{mode:o}"],
                 stdin=data, timeout=60)
