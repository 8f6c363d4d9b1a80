"""Flags of releases gpudeploy has not captured: read the real ``--help`` from a host that runs
it, once, and keep it on this machine (``flagcache``: by release and the help text's digest, with
the host that taught it and when); the plan then renders and checks flags against it like a
captured one, and says where it came from. The flag-rename table still picks spellings by option
names the release has, not by its version number.

A help text is kept only under the release the host's own engine reports: one whose release
cannot be read there (no package metadata, no ``__version__``, the interpreter failed) or is
another than the inventory's is refused, so no host can file a help text under a release it does
not run.
"""

from __future__ import annotations

from typing import Any

from .. import flagcache
from ..errors import RemoteError
from ..facts.probe import probe
from ..fanout import for_each_host, say
from ..model import Host, Inventory
from ..plan.flags import FlagsNotKnown
from ..remote import connect
from ..versions import same_release


def learn(inv: Inventory, needed: list[FlagsNotKnown]) -> list[str]:
    """Read each needed release's --help from one of its hosts (from each host that needs its own);
    return what was learned, or raise RemoteError naming the host when a host cannot tell its
    release, runs another one, or prints no usable help."""
    wanted: dict[tuple[str, str, str], FlagsNotKnown] = {}
    for n in needed:
        wanted.setdefault((n.program, n.version, (n.host or "") if n.own else ""), n)
    names = list(dict.fromkeys(n.host for n in wanted.values() if n.host))

    def one(host: Host) -> list[str]:
        mine = [n for n in wanted.values() if n.host == host.name]
        with connect(host) as remote:
            facts = probe(remote, {"help": [[n.python, n.module] for n in mine],
                                   "versions": {n.python: [package(n)] for n in mine}}, timeout=180)
        learned = []
        for n in mine:
            release_there(host, n, facts.get("versions", {}).get(n.python))
            got = facts.get("help", {}).get(f"{n.python} {n.module}") or {}
            try:
                entry = flagcache.save(n.program, n.version, got.get("text", ""), host.name)
            except ValueError as exc:
                raise RemoteError(host.name, f"`{n.python} -m {n.module} --help` gave no usable help "
                                  f"(exit {got.get('rc')}): {exc}; {got.get('error', '')[-200:]}") from None
            options = len(flagcache.flags_of(entry.path, entry.digest))
            say(f"[{host.name}] learned the flags of {n.program} {n.version} from its --help ({options} options, "
                f"sha256 {entry.digest[:12]})")
            learned.append(f"{n.program} {n.version}")
        return learned

    out: list[str] = []
    for res in for_each_host([inv.hosts[h] for h in names], one).values():
        if isinstance(res, Exception):
            raise res
        out += res
    return out


def package(n: FlagsNotKnown) -> str:
    return n.program.replace("_", "-")


def release_there(host: Host, n: FlagsNotKnown, versions: Any) -> None:
    """The release the host's engine reports must be the inventory's; a release it cannot report is
    refused too (its help text would be filed under a release nobody checked)."""
    versions = versions if isinstance(versions, dict) else {}
    found = versions.get(package(n))
    if found is None:
        why = versions.get("error") or (f"{package(n)} has no package metadata there and its module no "
                                        "__version__")
        raise RemoteError(host.name, f"cannot read which {n.program} release {n.python} has ({str(why)[-200:]}), so "
                          f"its --help is not kept as {n.program} {n.version}'s; gpudeploy learns flags only "
                          "from a host whose engine reports its release")
    if not same_release(str(found), n.version):
        raise RemoteError(host.name, f"{n.python} has {n.program} {found}, not {n.version} as the inventory "
                          "says; fix engine_versions")
