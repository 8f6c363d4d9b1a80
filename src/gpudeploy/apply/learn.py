"""Flags of releases gpudeploy has not captured: read the real ``--help`` from a host that runs
it, once, and keep it on this machine by release (``flagspec.LEARNED``); the plan then renders and
checks flags against it like a captured one. The flag-rename table still picks spellings by
option names the release has, not by its version number."""

from __future__ import annotations

from ..errors import RemoteError
from ..facts.probe import probe
from ..fanout import for_each_host, say
from ..flagspec import save_learned
from ..model import Host, Inventory
from ..plan.flags import FlagsNotKnown
from ..remote import connect
from ..versions import same_release


def learn(inv: Inventory, needed: list[FlagsNotKnown]) -> list[str]:
    """Read each needed release's --help from one of its hosts; return what was learned, or raise
    RemoteError naming the host when a host cannot tell (or runs another release)."""
    by_release: dict[tuple[str, str], FlagsNotKnown] = {}
    for n in needed:
        by_release.setdefault((n.program, n.version), n)
    hosts = [inv.hosts[n.host] for n in by_release.values() if n.host]

    def one(host: Host) -> list[str]:
        mine = [n for n in by_release.values() if n.host == host.name]
        with connect(host) as remote:
            facts = probe(remote, {"help": [[n.python, n.module] for n in mine],
                                   "versions": {n.python: [n.program.replace("_", "-")] for n in mine}}, timeout=180)
        learned = []
        for n in mine:
            found = (facts.get("versions", {}).get(n.python) or {}).get(n.program.replace("_", "-"))
            if found is not None and not same_release(str(found), n.version):
                raise RemoteError(host.name, f"{n.python} has {n.program} {found}, not {n.version} as the inventory "
                                  "says; fix engine_versions")
            got = facts.get("help", {}).get(f"{n.python} {n.module}") or {}
            try:
                flags = save_learned(n.program, n.version, got.get("text", ""))
            except ValueError as exc:
                raise RemoteError(host.name, f"`{n.python} -m {n.module} --help` gave no usable help "
                                  f"(exit {got.get('rc')}): {exc}; {got.get('error', '')[-200:]}") from None
            say(f"[{host.name}] learned the flags of {n.program} {n.version} from its --help ({len(flags)} options)")
            learned.append(f"{n.program} {n.version}")
        return learned

    out: list[str] = []
    for res in for_each_host(hosts, one).values():
        if isinstance(res, Exception):
            raise res
        out += res
    return out
