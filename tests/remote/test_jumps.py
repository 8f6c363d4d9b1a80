"""The jump chain to a host, resolved as OpenSSH resolves it (``jumps``), and what it costs status:
no ssh -G at all unless some ssh_config file names a proxy."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.model import Host, SshConfig, SshHop
from gpudeploy.remote import jumps, openssh, sshconfig


def _host(address: str = "gpu", hop: SshHop | None = None) -> Host:
    return Host(name="gpu1", address=address, ssh=SshConfig(user="root", known_hosts="/inv/kh", proxy_jump=hop),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


def _lookup(table: dict[str, jumps.Proxy]) -> jumps.Lookup:
    return lambda name, user, port: table.get(name, jumps.Proxy())


def _names(route: jumps.Route) -> list[str]:
    return [f"{h.user + '@' if h.user else ''}{h.address}{':' + str(h.port) if h.port else ''}" for h in route.hops]


# ssh_config (name -> ProxyJump) and the hops, first dialled first, that OpenSSH dials to "gpu"
CHAINS: list[tuple[dict[str, str], list[str]]] = [
    ({}, []),
    ({"gpu": "bastion"}, ["bastion"]),
    ({"gpu": "a,b,c"}, ["a", "b", "c"]),  # ssh -J a,b,c: a first
    ({"gpu": "a,b", "a": "outer"}, ["outer", "a", "b"]),  # the first hop's own ProxyJump is followed...
    ({"gpu": "a,b", "b": "elsewhere"}, ["a", "b"]),  # ...a later one's is not (it gets -J on its command line)
    ({"gpu": "u@a:2200,ssh://v@b:2222/"}, ["u@a:2200", "v@b:2222"]),
    ({"gpu": "[fe80::1]:2200"}, ["fe80::1:2200"]),
    ({"gpu": "bastion", "bastion": "none-of-these", "none-of-these": "outer"},
     ["outer", "none-of-these", "bastion"]),
]


@pytest.mark.parametrize(("config", "hops"), CHAINS)
def test_the_chain_is_openssh_s(config: dict[str, str], hops: list[str]) -> None:
    route = jumps.route(_host(), _lookup({k: jumps.Proxy(jump=v) for k, v in config.items()}))
    assert _names(route) == hops
    assert all(h.known_hosts == "/inv/kh" and h.key is None for h in route.hops)  # the host's trust files


def test_the_inventory_bastion_wins_and_its_own_ssh_config_jump_is_followed() -> None:
    hop = SshHop("bastion", user="ops", key="/k", known_hosts="/inv/bastion_kh")
    route = jumps.route(_host(hop=hop), _lookup({"gpu": jumps.Proxy(jump="ignored"),
                                                 "bastion": jumps.Proxy(jump="outer")}))
    assert _names(route) == ["outer", "ops@bastion"]
    assert route.hops[0].known_hosts == "/inv/bastion_kh" and route.hops[1] is hop


def test_no_lookup_means_only_the_inventory_bastion() -> None:
    hop = SshHop("bastion")
    assert jumps.route(_host(hop=hop), None).hops == (hop,)
    assert jumps.route(_host(), None) == jumps.Route()


@pytest.mark.parametrize(("config", "error"), [
    ({"gpu": "bastion", "bastion": "bastion"}, "loop: root@gpu -> bastion -> bastion"),
    ({"gpu": "a", "a": "b", "b": "a"}, "loop: root@gpu -> a -> b -> a"),
    ({"gpu": ",".join(f"h{i}" for i in range(9))}, "more than 8 jump hosts"),
    ({"gpu": "bad host"}, "is not"),
    ({"gpu": "a:99999"}, "out of range"),
])
def test_a_chain_that_cannot_be_dialled_is_refused(config: dict[str, str], error: str) -> None:
    with pytest.raises(jumps.JumpError, match=error):
        jumps.route(_host(), _lookup({k: jumps.Proxy(jump=v) for k, v in config.items()}))


@pytest.mark.parametrize(("command", "refused"), [
    ("ssh -W %h:%p bastion", True),
    ("exec /usr/bin/ssh -q -W %h:%p bastion", True),
    ("SSH_AUTH_SOCK=x ssh -W %h:%p bastion", True),
    ("nc %h %p", False),
    ("aws ssm start-session --target %h --document-name AWS-StartSSHSession", False),
    ("/usr/local/bin/cloudflared access ssh --hostname %h", False),
])
def test_a_proxycommand_is_refused_only_when_it_runs_ssh(command: str, refused: bool) -> None:
    lookup = _lookup({"gpu": jumps.Proxy(jump="bastion"), "bastion": jumps.Proxy(command=command)})
    if refused:
        with pytest.raises(jumps.JumpError, match="write it as ProxyJump"):
            jumps.route(_host(), lookup)
    else:
        route = jumps.route(_host(), lookup)
        assert (_names(route), route.relay) == (["bastion"], command)


# --- status's cost: ssh -G only where ssh_config names a proxy -------------------------------------

@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "ssh_config"
    monkeypatch.setenv(sshconfig.ENV, str(config))
    monkeypatch.setattr(openssh, "CONTROL_DIR", tmp_path / "cm")
    monkeypatch.setattr(sshconfig, "_effective", {})
    return config


def _count_ssh_g(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], **kwargs: Any) -> Any:
        calls.append(argv)
        return real(argv, **kwargs)

    monkeypatch.setattr(sshconfig.subprocess, "run", run)
    return calls


def test_status_runs_no_ssh_G_when_no_ssh_config_names_a_proxy(ssh_config: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "more.conf").write_text("Host *\n  ServerAliveInterval 5\n")
    ssh_config.write_text(f"Host gpu\n  HostName 10.0.0.7\n  User root\nInclude {tmp_path}/*.conf\n")
    calls = _count_ssh_g(monkeypatch)
    for _ in range(3):
        openssh.ssh_argv(_host(), ["true"])
        openssh.ssh_argv(_host(hop=SshHop("bastion")), ["true"])
    assert calls == []
    assert str(tmp_path / "more.conf") in sshconfig.scan().files  # an included file counts too


def test_with_a_proxy_in_ssh_config_each_host_is_read_once(ssh_config: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the ProxyJump hides in an included file
    (tmp_path / "jumps.conf").write_text("Host gpu\n  ProxyJump bastion\n")
    ssh_config.write_text(f"Include {tmp_path}/jumps.conf\n")
    calls = _count_ssh_g(monkeypatch)
    for _ in range(3):
        argv = openssh.ssh_argv(_host(), ["true"])
    assert [c[-1] for c in calls] == ["gpu", "bastion"]  # once each, then cached
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert "-- bastion" in proxy and "ProxyCommand=none" in proxy


def test_a_changed_ssh_config_is_read_again(ssh_config: Path) -> None:
    ssh_config.write_text("Host gpu\n  User root\n")
    assert not sshconfig.scan().names_proxy
    ssh_config.write_text("Host gpu\n  ProxyJump bastion\n")
    assert sshconfig.scan().names_proxy


def test_an_include_gpudeploy_cannot_follow_counts_as_naming_anything(ssh_config: Path) -> None:
    ssh_config.write_text("Include ~/.ssh/%h.conf\n")
    assert sshconfig.scan().names_proxy
