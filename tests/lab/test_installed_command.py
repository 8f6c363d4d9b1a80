"""The `gpudeploy` command as a new user gets it (issue 25): a fresh virtualenv outside this repository,
`pip install <this repo>`, then in a folder of the user's own `gpudeploy init --host <lab1>` writes the
inventory from the host's facts and `gpudeploy deploy`, `status` and `teardown` run it with the
packaged roles and templates (no roles/ or templates/ folder anywhere near). Also: init on a host
without NVML writes TODO placeholders, init refuses a host whose key is not known and writes nothing,
and one role file placed three times on one host deploys three instances.

Every wait is a condition with a deadline; every deployment is torn down (with --purge) afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import KEY, KNOWN_HOSTS, REPO, STORES, Deployments, gd, standin_role, status_json

from gpudeploy_lab import control

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv outside the repository with `pip install <repo>` in it: its bin folder."""
    root = tmp_path_factory.mktemp("user")
    venv = root / "venv"
    assert not str(venv).startswith(str(REPO))
    # `pip install <repo>` of a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    source = root / "gpudeploy"
    # (links stay links, as in a clone: src/gpudeploy/roles and templates are links to roles/ and templates/)
    shutil.copytree(REPO, source, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", ".bench-venv", "build", "*.egg-info", "__pycache__",
                                                  ".pytest_cache", ".mypy_cache", ".ruff_cache"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(source)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lab_import = subprocess.run([str(venv / "bin" / "python"), "-c", "import gpudeploy_lab"], capture_output=True,
                                text=True, timeout=60, cwd=venv.parent)
    assert lab_import.returncode != 0, "the lab must not be installed with the package"
    return venv / "bin"


def user(bin_dir: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`gpudeploy ARGS` in the user's own folder, as they would type it (no repo on any path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUDEPLOY_INVENTORY", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update({**STORES, "PATH": f"{bin_dir}:{env.get('PATH', '')}"})
    res = subprocess.run([str(bin_dir / "gpudeploy"), *args], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, env=env)
    print(f"$ gpudeploy {' '.join(args)}\n{res.stdout[-4000:]}{res.stderr[-2000:]}")
    return res


@pytest.fixture
def own_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "my-inference"
    folder.mkdir()
    return folder


def test_install_init_deploy_status_teardown_with_the_packaged_roles(installed: Path, lab: Lab,
                                                                    own_folder: Path) -> None:
    listed = user(installed, own_folder, "--list")
    assert listed.returncode == 0 and "init" in listed.stdout and "lab." not in listed.stdout, listed.stderr
    roles = user(installed, own_folder, "roles")
    assert roles.returncode == 0 and all(f"{r} " in roles.stdout for r in ("prefill", "decode", "router", "vllm",
                                                                            "command")), roles.stdout
    address = lab.address_of("lab1")
    init = user(installed, own_folder, "init", "--host", address, "--user", "root", "--key", KEY,
                "--known-hosts", KNOWN_HOSTS)
    assert init.returncode == 0, init.stdout + init.stderr
    written = own_folder / "inventory" / "hosts.yml"
    text = written.read_text()
    doc = yaml.safe_load(text)
    host = doc["hosts"]["lab1"]  # the host's own name, from the host
    gpus_json = json.loads(lab.ssh("lab1", "cat /etc/gpudeploy-lab/gpus.json", check=True).stdout)["gpus"]
    assert host["address"] == address
    assert host["gpu_memory_gib"] == int(gpus_json[0]["memory_total_bytes"] * 10 / 2**30) / 10  # NVML's total
    assert [n["gpus"] for n in host["numa_nodes"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # NVML's NUMA nodes
    assert host["python"] == "/usr/bin/python3"
    assert host["engine_versions"] == {"sglang": "0.5.23", "sglang_router": "0.3.2"}
    assert host["roles"] == [{"role": "prefill", "gpus": [0, 1, 2, 3]}, {"role": "decode", "gpus": [4, 5, 6, 7]},
                             "router"]
    assert all(g["pci_bus_id"] in text for g in gpus_json)  # PCI bus ids as comments
    prose = re.sub(r"\n *# *", " ", text)  # comments are wrapped at 104 columns
    assert "this NVML says it is a stand-in" in prose and "/opt/gpudeploy/engines/vllm/venv/bin/python3" in prose
    assert doc["defaults"]["ssh"] == {"user": "root", "key": KEY, "known_hosts": KNOWN_HOSTS}
    again = user(installed, own_folder, "init", "--host", address)
    assert again.returncode == 1 and "exists; init never overwrites" in again.stderr and written.read_text() == text
    try:
        # ./inventory/hosts.yml is the default: the user types no --inventory
        deploy = user(installed, own_folder, "deploy", timeout=600)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        for role in ("prefill", "decode", "router"):
            assert f"lab1/{role}: started" in deploy.stdout, deploy.stdout
        assert "deployment pd: READY" in deploy.stdout and "smoke /generate through lab1/router" in deploy.stdout
        unit = lab.ssh("lab1", "cat /etc/systemd/system/gpudeploy-pd.decode.service", check=True).stdout
        assert "rendered by gpudeploy from role decode" in unit  # the packaged template
        status = user(installed, own_folder, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "lab1/decode: power and utilisation now: GPU 4 " in status.stdout, status.stdout
        assert "(a stand-in NVML: modelled, not measured)" in status.stdout
        doc_status = json.loads(user(installed, own_folder, "status", "--json").stdout)
        units = {u["role"]: u for u in doc_status["hosts"]["lab1"]["units"]}
        assert all(units[r]["healthy"] for r in ("prefill", "decode", "router")), units
        drawn = units["decode"]["gpus"]
        # held by the engine: at least the board's assumed idle draw (35 W) + 53 % (an H200's, measured)
        assert sorted(drawn) == ["4", "5", "6", "7"] and all(g["power_w"] >= 49 for g in drawn.values()), drawn
        assert all(g["power_limit_w"] == 600.0 for g in drawn.values())  # the lab's boards
    finally:
        down = user(installed, own_folder, "teardown", "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.count("clean: no process left") == 3, down.stdout
    assert lab.ssh("lab1", "ls /etc/systemd/system/ | grep -cF gpudeploy-pd. || true").stdout.strip() == "0"


@pytest.fixture
def lab3_without_nvml(lab: Lab) -> Iterator[str]:
    control.remove_nvml("lab3")
    yield "lab3"
    control.restore_nvml("lab3")


def test_init_on_a_host_without_nvml_writes_placeholders_marked_todo(installed: Path, lab: Lab, own_folder: Path,
                                                                    lab3_without_nvml: str) -> None:
    out = own_folder / "lab3.yml"
    res = user(installed, own_folder, "init", "--host", lab.address_of("lab3"), "--user", "root", "--key", KEY,
               "--known-hosts", KNOWN_HOSTS, "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no GPUs listed: NVML init failed" in res.stdout and "(placeholders marked TODO)" in res.stdout
    text = out.read_text()
    assert "# TODO: no NVML on this host (NVML init failed: NVML Shared Library Not Found)" in text, text
    host = yaml.safe_load(text)["hosts"]["lab3"]
    assert host["roles"] == [] and all(n["gpus"] == [] for n in host["numa_nodes"])
    plan = user(installed, own_folder, "plan", "--inventory", str(out))
    assert plan.returncode == 0, plan.stdout + plan.stderr  # it loads: the TODOs are comments and empty lists


def test_init_refuses_an_unknown_host_and_says_how_to_add_its_key(installed: Path, lab: Lab,
                                                                 own_folder: Path) -> None:
    empty = own_folder / "known_hosts"
    empty.write_text("")
    home = own_folder / "home"  # no ~/.ssh/known_hosts of the user's that could know the lab
    home.mkdir()
    env_home = {"HOME": str(home)}
    address = lab.address_of("lab2")
    res = subprocess.run([str(installed / "gpudeploy"), "init", "--host", address, "--user", "root", "--key", KEY,
                          "--known-hosts", str(empty)], cwd=own_folder, capture_output=True, text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}, **env_home})
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "is not in known_hosts" in out and f"ssh-keyscan {address} | ssh-keygen -lf -" in out, out
    assert "nothing was written" in out and not (own_folder / "inventory").exists()
    assert empty.read_text() == ""  # never added


def test_one_role_file_placed_three_times_on_one_host_is_three_instances(deployments: Deployments,
                                                                         lab: Lab) -> None:
    role = standin_role(None, tp=2)
    placed: list[Any] = [{"role": "srv", "name": "srv-a", "gpus": [0, 1]},
                         {"role": "srv", "name": "srv-b", "gpus": [2, 3], "port": 30100},
                         {"role": "srv", "name": "srv-c", "gpus": [4, 5]}]
    inv = deployments.inventory("tri", {"srv": role}, host="lab2", placed=placed)
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
    for name, port in (("srv-a", 30000), ("srv-b", 30100), ("srv-c", 30020)):
        assert f"lab2/{name}: started" in res.stdout, res.stdout
        assert f"http://{lab.address_of('lab2')}:{port}" in res.stdout, res.stdout
    units = {u["role"]: u for u in status_json(inv)["hosts"]["lab2"]["units"]}
    assert sorted(units) == ["srv-a", "srv-b", "srv-c"] and all(u["healthy"] for u in units.values()), units
    assert {r: units[r]["ports"]["http"] for r in units} == {"srv-a": 30000, "srv-b": 30100, "srv-c": 30020}
    assert {r: sorted(units[r]["gpu_memory_gib"]) for r in units} == {"srv-a": ["0", "1"], "srv-b": ["2", "3"],
                                                                     "srv-c": ["4", "5"]}
    assert len({units[r]["main_pid"] for r in units}) == 3
    env = lab.ssh("lab2", "cat /etc/gpudeploy/tri.srv-b.env", check=True).stdout
    assert "CUDA_VISIBLE_DEVICES=2,3" in env
    one = gd("teardown", "--inventory", str(inv), "--host", "lab2", "--role", "srv-b")  # one instance alone
    assert one.returncode == 0 and "lab2/srv-b: was active" in one.stdout, one.stdout
    rest = {u["role"]: u for u in status_json(inv)["hosts"]["lab2"]["units"]}
    assert rest["srv-a"]["healthy"] and rest["srv-c"]["healthy"] and not rest["srv-b"]["healthy"]
    down = gd("teardown", "--inventory", str(inv), "--host", "lab2", "--role", "srv")  # the role file: all three
    assert down.returncode == 0 and down.stdout.count("clean: no process left") == 3, down.stdout
