"""gpudeploy init: the probe's facts -> an inventory that loads and plans (cases.yml), its host names
and addresses, and the command's own rules: an existing file is kept, a host that does not answer
(an unknown host key included) writes nothing and says how to add the key, the file appears whole."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpudeploy.init as init
from gpudeploy.errors import HostUnreachable, InputError
from gpudeploy.facts import remote_probe
from gpudeploy.init.found import from_probe, host_name
from gpudeploy.init.write import SshDefaults, inventory_text
from gpudeploy.inventory import load_inventory
from gpudeploy.plan import load_plan

CASES = yaml.safe_load((Path(__file__).parent / "cases.yml").read_text())
GIB = 2**30


def devices(spec: dict[str, list[int | None]]) -> list[dict[str, Any]]:
    """{gpuN: [numa of each]} -> NVML devices as the probe reports them (96 GiB H200-class GPUs)."""
    (numas,) = spec.values()
    return [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i:08x}", "bus_id": f"00000000:{0x18 + i:02x}:00.0",
             "numa_node": n, "total": 96 * GIB, "used": 644_939_776, "free": 96 * GIB - 644_939_776}
            for i, n in enumerate(numas)]


def facts_of(case: dict[str, Any]) -> dict[str, Any]:
    facts = dict(case["facts"])
    gpus = dict(facts["gpus"])
    gpus["devices"] = devices(gpus["devices"][0]) if gpus.get("devices") else []
    return {**facts, "gpus": gpus}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    facts = facts_of(case)
    found = from_probe(host_name(facts["hostname"], case["address"], set()), case["address"], None, None, facts)
    text = inventory_text([found], deployment="pd", ssh=SshDefaults(user="root"), today="2026-12-01")
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(text)
    load_inventory(path)  # it loads: every TODO is a comment or a value that parses
    want = case["expect"]
    for needle in want.get("text", []):
        assert needle in text, f"{needle!r} not in\n{text}"
    for needle in want.get("lacks", []):
        assert needle not in text, f"{needle!r} in\n{text}"
    if not want["units"]:
        assert "roles: []" in text
        assert load_plan(str(path), memory=False).units == ()
        return
    plan = load_plan(str(path), offline_flags=True)
    got = {u.key: [list(u.gpus), u.numa_node] for u in plan.units}
    assert {k: v for k, v in got.items() if k in want["units"]} == want["units"], got
    assert set(got) == set(want["units"]) | {k for k in got if k.endswith("/router")}
    for key, cpus in want.get("cpus", {}).items():
        assert next(u.cpus for u in plan.units if u.key == key) == cpus


def test_two_hosts_get_a_pair_each_and_one_router_in_front_of_both(tmp_path: Path) -> None:
    facts = facts_of(CASES["two_sockets"])
    taken: set[str] = set()
    hosts = []
    for address in ("192.0.2.1", "192.0.2.2"):
        name = host_name("gpu", address, taken)
        taken.add(name)
        hosts.append(from_probe(name, address, None, None, facts))
    assert [h.name for h in hosts] == ["gpu", "gpu-2"]
    path = tmp_path / "hosts.yml"
    path.write_text(inventory_text(hosts, deployment="pd", ssh=SshDefaults(), today="2026-12-01"))
    plan = load_plan(str(path), offline_flags=True)
    assert sorted(u.key for u in plan.units) == ["gpu-2/decode", "gpu-2/prefill", "gpu/decode", "gpu/prefill",
                                                 "gpu/router"]
    router = next(u for u in plan.units if u.role.name == "router")
    assert router.argv.count("--prefill") == 2 and router.argv.count("--decode") == 2


def test_host_names_and_addresses() -> None:
    assert host_name("node171.example.com", "10.0.0.171", set()) == "node171"
    assert host_name("", "10.0.0.171", set()) == "host-10-0-0-171"
    assert host_name("", "gpu-a.lan", set()) == "gpu-a-lan"
    assert host_name("GPU_Box!", "10.0.0.1", {"gpu_box"}) == "gpu_box-2"
    assert init.parse_address("root@10.0.0.1:2222") == ("root", "10.0.0.1", 2222)
    assert init.parse_address("[fd00::1]:22") == (None, "fd00::1", 22)
    assert init.parse_address("node171") == (None, "node171", None)
    for bad in ("-oProxyCommand=x", "a b", "host:99999", "x@y@z"):
        with pytest.raises(InputError):
            init.parse_address(bad)


def test_the_probe_finds_each_python_once_and_its_engines(tmp_path: Path) -> None:
    for venv in ("a", "b"):
        (tmp_path / venv / "bin").mkdir(parents=True)
        os.symlink(remote_probe.sys.executable, tmp_path / venv / "bin" / "python3")
    (tmp_path / "c" / "bin").mkdir(parents=True)
    (tmp_path / "c" / "bin" / "python3").write_text("not executable")
    found = remote_probe.find_pythons(["self", str(tmp_path / "*" / "bin" / "python3"), "self",
                                       str(tmp_path / "none" / "python3")])
    assert found == [remote_probe.sys.executable, str(tmp_path / "a/bin/python3"), str(tmp_path / "b/bin/python3")]
    got = remote_probe.engines({"pythons": [str(tmp_path / "a/bin/python3")], "packages": ["pyyaml", "vllm"]})
    versions = got[str(tmp_path / "a/bin/python3")]  # that interpreter's own (a symlink has no venv)
    assert versions["vllm"] is None and str(versions["pyyaml"])[:1].isdigit(), versions
    # a package no distribution names is imported for its __version__ (the lab's stand-in sglang);
    # one a distribution of another name provides is read from that distribution, never imported
    (tmp_path / "site" / "sglang").mkdir(parents=True)
    (tmp_path / "site" / "sglang" / "__init__.py").write_text('__version__ = "0.5.99"\n')
    (tmp_path / "site" / "yaml").mkdir()
    (tmp_path / "site" / "yaml" / "__init__.py").write_text("raise SystemExit('imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    res = subprocess.run([remote_probe.sys.executable, "-s", "-c", remote_probe.ENGINE_SCRIPT, "sglang", "yaml",
                          "vllm"], capture_output=True, text=True, env=env, timeout=60)
    doc = json.loads(res.stdout)
    assert doc["sglang"] == "0.5.99" and doc["vllm"] is None
    assert doc["yaml"] == yaml.__version__  # PyYAML's distribution owns the module: read, not imported


def answer(facts: dict[str, Any] | Exception) -> Any:
    """The probe of every host: these facts, or this error (no host is reached)."""
    class Fake:
        def __init__(self, host: Any) -> None:
            self.host = host

        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def probe(remote: Fake, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        if isinstance(facts, Exception):
            raise facts
        assert spec["gpus"] and spec["topology"] and "sglang" in spec["engines"]["packages"]
        return {**facts, "hostname": f"h{remote.host.address.rsplit('.', 1)[1]}"}

    return Fake, probe


def test_init_writes_the_file_whole_and_never_over_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, probe = answer(facts_of(CASES["lab_like"]))
    monkeypatch.setattr(init, "connect", fake)
    monkeypatch.setattr(init, "probe", probe)
    out = tmp_path / "inv" / "hosts.yml"
    opts = init.InitOptions(addresses=("10.231.0.11", "root@10.231.0.12:2222"), out=str(out), user="root",
                            key="/var/lib/gpudeploy-lab/id_ed25519", known_hosts="/var/lib/gpudeploy-lab/known_hosts")
    report, ok = init.init_inventory(opts)
    assert ok and f"wrote {out}" in report and "next: gpudeploy plan" in report, report
    doc = yaml.safe_load(out.read_text())
    assert list(doc["hosts"]) == ["h11", "h12"] and doc["hosts"]["h12"]["ssh"] == {"user": "root", "port": 2222}
    assert doc["defaults"]["ssh"] == {"user": "root", "key": "/var/lib/gpudeploy-lab/id_ed25519",
                                      "known_hosts": "/var/lib/gpudeploy-lab/known_hosts"}
    assert [p.name for p in out.parent.iterdir()] == ["hosts.yml"]  # no temporary file left
    before = out.read_text()
    with pytest.raises(InputError) as err:
        init.init_inventory(opts)
    assert "exists; init never overwrites an inventory (--force does" in str(err.value)
    assert out.read_text() == before
    _, ok = init.init_inventory(init.InitOptions(addresses=("10.231.0.13",), out=str(out), force=True))
    assert ok and list(yaml.safe_load(out.read_text())["hosts"]) == ["h13"]


def test_an_unknown_host_key_writes_nothing_and_says_how_to_add_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    refused = HostUnreachable("10.0.0.5", "10.0.0.5 is not in known_hosts (/root/.ssh/known_hosts); add its host "
                                          "key first (host keys are always checked)")
    fake, probe = answer(refused)
    monkeypatch.setattr(init, "connect", fake)
    monkeypatch.setattr(init, "probe", probe)
    out = tmp_path / "hosts.yml"
    report, ok = init.init_inventory(init.InitOptions(addresses=("10.0.0.5:2200",), out=str(out)))
    assert not ok and not out.exists()
    assert report.startswith("10.0.0.5: 10.0.0.5 is not in known_hosts"), report
    assert "ssh-keyscan -p 2200 10.0.0.5 | ssh-keygen -lf -" in report and "[10.0.0.5]:2200" in report
    assert "nothing was written" in report and "init never adds" not in report
