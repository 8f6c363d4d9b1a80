"""The jump hosts on the way to a host, resolved as OpenSSH resolves them, so that both transports
dial every hop themselves with the one trust rule (issue 20, item 10).

Left to itself, ssh dials the jump hosts of ssh_config's ProxyJump with none of the options on its
command line (ssh(1)), so with the user's own trust settings, and fabric dials them with paramiko's
AutoAddPolicy (any key accepted). Here the chain is made explicit, in OpenSSH's order:

* The inventory's ``ssh.proxy_jump`` wins over the host's own ssh_config (as our ProxyCommand/
  gateway overrides it); otherwise the host's effective ProxyJump ``a,b,c`` (``ssh -G``) means:
  dial ``a``, through it ``b``, through that ``c``, through that the host (ssh.c: the last one is
  the jump host, the others its ``-J``). ``a`` is dialled as ssh dials any host, so *its* own
  ProxyJump is followed in turn; ``b`` and ``c`` get ``-J`` on their command line, so theirs is not.
* A hop from ssh_config is checked against the known_hosts files of the host (or inventory hop)
  it leads to, with the login, port and key ssh_config gives it.
* A ProxyCommand that runs ssh is a hop gpudeploy cannot give its options to: refused, with the
  advice to write it as ProxyJump, and with the ssh_config line that sets it. Any ssh counts, at
  any depth the shell would run it (``env ssh``, ``timeout 10 ssh``, ``sh -c "ssh ..."``,
  ``autossh``: ``proxycommand``), and a command whose ssh could hide from that reading (one that
  does not parse, a program named by ``$VAR``) is refused too. Any other ProxyCommand (nc, socat,
  a cloud's tunnel) only relays bytes: it makes no SSH hop, and the host key is still checked
  through it.
* A loop (``Host * ProxyJump bastion`` reaching ``bastion`` too) or more than ``MAX_HOPS`` hops is
  refused (ssh itself would spawn itself without end).

No paramiko here (``invoke status`` imports this).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..model import Host, SshHop
from . import proxycommand, sshconfig

MAX_HOPS = 8


class JumpError(Exception):
    """The way to a host cannot be dialled with every hop checked: the message says why."""


@dataclass(frozen=True)
class Proxy:
    """What ssh_config says about reaching one host: its ProxyJump or ProxyCommand, if any."""

    jump: str | None = None
    command: str | None = None


# (name, user, port) as given to ssh -> that host's Proxy
Lookup = Callable[[str, "str | None", "int | None"], Proxy]


@dataclass(frozen=True)
class Route:
    hops: tuple[SshHop, ...] = ()  # dialled first to last; the host is reached through the last
    relay: str | None = None  # a ProxyCommand (no ssh in it) that reaches hops[0], or the host if no hops


def parse_jump(value: str) -> list[tuple[str, str | None, int | None]]:
    """A ProxyJump value: ``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, comma-separated,
    as (host, user, port); IPv6 addresses in brackets (readconf.c parse_jump)."""
    out: list[tuple[str, str | None, int | None]] = []
    for raw in value.split(","):
        item = raw.strip()
        if item.startswith("ssh://"):
            item = item[len("ssh://"):].rstrip("/")
        user, at, hostport = item.rpartition("@")
        m = re.fullmatch(r"\[([^\]\s]+)\](?::(\d+))?|([^:\[\]\s]+)(?::(\d+))?", hostport)
        if not at:
            user = ""
        if not m or not hostport:
            raise JumpError(f"ProxyJump {value!r}: {raw.strip()!r} is not [user@]host[:port]")
        host = m.group(1) or m.group(3)
        port_s = m.group(2) or m.group(4)
        port = int(port_s) if port_s else None
        if port is not None and not 0 < port < 65536:
            raise JumpError(f"ProxyJump {value!r}: port {port} is out of range")
        out.append((host, user or None, port))
    return out


def _ident(hop: SshHop) -> str:
    who = f"{hop.user}@" if hop.user else ""
    return who + hop.address + (f":{hop.port}" if hop.port is not None else "")


def _refused(dest: SshHop, command: str, refusal: proxycommand.Refusal) -> str:
    where = ", ".join(sshconfig.lines_setting("ProxyCommand", command)[:3])  # ssh -G does not say
    return (f"ssh_config reaches {dest.address} through `ProxyCommand {command}`" + (f" ({where})" if where else "")
            + f", {refusal.why}: {refusal.advice} (or set ssh.proxy_jump in the inventory)")


def _reach(dest: SshHop, lookup: Lookup, seen: list[str]) -> Route:
    """How ssh would reach ``dest`` from its ssh_config: the hops before it, and any relay."""
    ident = _ident(dest)
    if ident.lower() in (s.lower() for s in seen):
        raise JumpError(f"ssh_config's ProxyJump goes round in a loop: {' -> '.join([*seen, ident])}")
    proxy = lookup(dest.address, dest.user, dest.port)
    if proxy.jump is None:
        if proxy.command is None:
            return Route()
        refusal = proxycommand.problem(proxy.command)
        if refusal is not None:
            raise JumpError(_refused(dest, proxy.command, refusal))
        return Route(relay=proxy.command)
    hops = [SshHop(address=h, user=u, port=p, key=None, known_hosts=dest.known_hosts,
                   connect_timeout_s=dest.connect_timeout_s) for h, u, p in parse_jump(proxy.jump)]
    if len(seen) + len(hops) > MAX_HOPS:
        raise JumpError(f"the way to {seen[0] if seen else ident} has more than {MAX_HOPS} jump hosts")
    before = _reach(hops[0], lookup, [*seen, ident])
    return Route(before.hops + tuple(hops), before.relay)


def route(host: Host, lookup: Lookup | None) -> Route:
    """The hops to ``host``: the inventory's proxy_jump, or ssh_config's; ``lookup`` None: ssh_config
    names no proxy at all (``sshconfig.Scan.names_proxy``), so only the inventory's counts."""
    ssh = host.ssh
    target = SshHop(address=host.address, user=ssh.user, port=ssh.port, key=ssh.key, known_hosts=ssh.known_hosts,
                    connect_timeout_s=ssh.connect_timeout_s)
    hop = ssh.proxy_jump
    if hop is not None:
        before = _reach(hop, lookup, [_ident(target)]) if lookup is not None else Route()
        return Route((*before.hops, hop), before.relay)
    return _reach(target, lookup, []) if lookup is not None else Route()


def from_ssh_config(name: str, user: str | None, port: int | None) -> Proxy:
    """A host's ProxyJump/ProxyCommand as ssh itself has them (``ssh -G``)."""
    try:
        eff = sshconfig.effective(name, user, port)
    except sshconfig.SshConfigError as exc:
        raise JumpError(str(exc)) from None
    jump, command = eff.get("proxyjump"), eff.get("proxycommand")
    return Proxy(jump if jump and jump.lower() != "none" else None,
                 command if command and command.lower() != "none" else None)


def lookup() -> Lookup | None:
    """How to read ssh_config's proxies now: None (no ssh -G at all) where no file names one."""
    return from_ssh_config if sshconfig.scan().names_proxy else None
