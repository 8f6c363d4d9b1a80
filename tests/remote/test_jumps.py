"""The jump chain to a host, resolved as OpenSSH resolves it (``jumps``), and what it costs status:
no ssh -G at all unless some ssh_config file names a proxy."""

from __future__ import annotations

import functools
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.errors import HostUnreachable
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


# A ProxyCommand and the ssh client it starts (None: it only relays bytes and is let through).
PROXY_COMMANDS: list[tuple[str, str | None]] = [
    ("ssh -W %h:%p bastion", "ssh"),
    ("exec /usr/bin/ssh -q -W %h:%p bastion", "/usr/bin/ssh"),
    ("SSH_AUTH_SOCK=x ssh -W %h:%p bastion", "ssh"),
    # issue 43, item 12: the first word is not the only one that runs
    ("env ssh -W %h:%p bastion", "ssh"),
    ("env -u SSH_AUTH_SOCK A=1 /usr/bin/ssh -W %h:%p bastion", "/usr/bin/ssh"),
    ('sh -c "ssh -W %h:%p bastion"', "ssh"),
    ("bash -lc 'exec ssh -W %h:%p bastion'", "ssh"),
    ("""sudo -u ops sh -c "sh -c 'ssh -W %h:%p bastion'\"""", "ssh"),
    ("timeout 10 ssh -W %h:%p bastion", "ssh"),
    ("timeout -s KILL 10 ssh -W %h:%p bastion", "ssh"),
    ("nice -n 5 ssh -W %h:%p bastion", "ssh"),
    ("exec nice ssh -W %h:%p bastion", "ssh"),
    ("autossh -M 0 -W %h:%p bastion", "autossh"),
    ("/mnt/c/Windows/System32/OpenSSH/ssh.exe -W %h:%p bastion", "/mnt/c/Windows/System32/OpenSSH/ssh.exe"),
    ("sshpass -f pw ssh -W %h:%p bastion", "sshpass"),
    ("nc -z bastion 22; ssh -W %h:%p bastion", "ssh"),
    ("nc %h %p || exec ssh -W %h:%p bastion", "ssh"),
    ("2>/dev/null ssh -W %h:%p bastion", "ssh"),
    ("(ssh -W %h:%p bastion)", "ssh"),
    ("eval ssh -W %h:%p bastion", "ssh"),
    ("su ops -c 'ssh -W %h:%p bastion'", "ssh"),
    ("nc $(ssh bastion cat gpu-address) %p", "ssh"),
    ('nc "$(ssh bastion cat gpu-address)" %p', "ssh"),
    ("nc%h#x; ssh -W %h:%p bastion", "ssh"),  # a # inside a word begins no comment
    # relays: their own words are theirs, even the word ssh
    ("nc %h %p", None),
    ("exec nc %h %p", None),
    ("socat - TCP:%h:%p", None),
    ("corkscrew proxy.example 8080 %h %p", None),
    ("nc -X connect -x proxy.example:3128 %h %p  # not through ssh", None),
    ("timeout 5 nc ssh.example.com 22", None),  # a host whose name begins with ssh
    ("aws ssm start-session --target %h --document-name AWS-StartSSHSession", None),
    ("/usr/local/bin/cloudflared access ssh --hostname %h", None),
    ("tsh proxy ssh %r@%h:%p", None),
    ("$HOME/bin/relay %h %p 2>/dev/null", None),
]


@pytest.mark.parametrize(("command", "client"), PROXY_COMMANDS)
def test_a_proxycommand_is_refused_only_when_it_runs_ssh(command: str, client: str | None, ssh_config: Path) -> None:
    lookup = _lookup({"gpu": jumps.Proxy(jump="bastion"), "bastion": jumps.Proxy(command=command)})
    if client is not None:
        with pytest.raises(jumps.JumpError) as exc:
            jumps.route(_host(), lookup)
        assert f"ssh_config reaches bastion through `ProxyCommand {command}`" in str(exc.value)
        assert f"runs `{client}`" in str(exc.value) and "write it as ProxyJump" in str(exc.value)
    else:
        route = jumps.route(_host(), lookup)
        assert (_names(route), route.relay) == (["bastion"], command)


NESTED = functools.reduce(lambda line, _: "sh -c " + shlex.quote(line), range(10), "nc %h %p")


@pytest.mark.parametrize(("command", "why"), [
    ("sh -c 'ssh -W %h:%p bastion", "cannot be read as a shell command line (No closing quotation)"),
    ("nc %h %p \\", "cannot be read as a shell command line (No escaped character)"),
    ('"$SSH" -W %h:%p bastion', "whose program `$SSH` is known only when the shell runs it"),
    ("exec $(command -v ssh) -W %h:%p bastion", "whose program `$(...)` is known only when the shell runs it"),
    (NESTED, "nests command lines more than 8 deep"),
])
def test_a_proxycommand_that_could_hide_an_ssh_is_refused_saying_why(command: str, why: str,
                                                                     ssh_config: Path) -> None:
    lookup = _lookup({"gpu": jumps.Proxy(command=command)})
    with pytest.raises(jumps.JumpError) as exc:
        jumps.route(_host(), lookup)
    assert f"ssh_config reaches gpu through `ProxyCommand {command}`, " in str(exc.value)
    assert why in str(exc.value) and "write the hop as ProxyJump" in str(exc.value)


def test_the_refusal_names_the_ssh_config_line_that_sets_the_proxycommand(ssh_config: Path) -> None:
    ssh_config.write_text("Host gpu\n  ProxyJump bastion\n\nHost bastion\n"
                          "  ProxyCommand timeout 10 ssh -W %h:%p outer\n")
    with pytest.raises(HostUnreachable) as exc:
        openssh.ssh_argv(_host(), ["true"])
    assert str(exc.value) == (
        f"gpu1: ssh_config reaches bastion through `ProxyCommand timeout 10 ssh -W %h:%p outer` ({ssh_config}:5), "
        "which runs `ssh` through `timeout`: an ssh that gpudeploy cannot give its host-key checks to; write it as "
        "ProxyJump (or set ssh.proxy_jump in the inventory)")


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
