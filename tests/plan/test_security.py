"""Role files are data: planning never runs their code, and unit names never collide."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpudeploy.errors import InputError
from gpudeploy.plan import load_plan, unit_name
from gpudeploy.remote.ssh import Remote

REPO = Path(__file__).resolve().parents[2]


def _inventory(root: Path, role: dict[str, object], deployment: str = "sec", ssh: dict[str, object] | None = None
               ) -> Path:
    (root / "roles").mkdir()
    (root / "roles" / "cmd.yml").write_text(yaml.safe_dump(role))
    inv = {"deployment": deployment, "roles_dir": "roles",
           "defaults": {"gpu_memory_gib": 24, **({"ssh": ssh} if ssh else {})},
           "hosts": {"box": {"address": "192.0.2.9", "numa_nodes": [{"id": 0, "gpus": [0], "cpus": "0"}],
                             "roles": ["cmd"]}}}
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_plan_does_not_run_code_from_an_argv_template(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}"
    inv = _inventory(tmp_path, {"engine": "command", "gpus": 0, "argv": ["/usr/bin/true", payload]})
    with pytest.raises(InputError) as err:
        load_plan(str(inv))
    assert not marker.exists(), "planning ran a command from a role file"
    assert "argv[1]" in str(err.value) and "unsafe" in str(err.value)


def test_unit_names_of_different_deployments_and_roles_never_collide() -> None:
    # With "-" between them both were gpudeploy-pd-test-decode.service.
    assert unit_name("pd", "test-decode") != unit_name("pd-test", "decode")
    assert unit_name("pd", "test-decode") == "gpudeploy-pd.test-decode.service"


def test_a_fractional_connect_timeout_is_kept(tmp_path: Path) -> None:
    # fabric rounds connect_timeout down to whole seconds; 0.5 became 0, and 0 meant no timeout.
    inv = _inventory(tmp_path, {"engine": "command", "gpus": 0, "argv": ["/usr/bin/true"]},
                     ssh={"connect_timeout_s": 0.5})
    host = load_plan(str(inv), memory=False).inventory.hosts["box"]
    remote = Remote(host)
    assert remote.conn.connect_kwargs["timeout"] == 0.5 and not remote.conn.connect_timeout


def test_a_zero_connect_timeout_is_refused(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {"engine": "command", "gpus": 0, "argv": ["/usr/bin/true"]},
                     ssh={"connect_timeout_s": 0})
    with pytest.raises(InputError, match=r"ssh\.connect_timeout_s: must be a positive number of seconds"):
        load_plan(str(inv), memory=False)


def test_ssh_user_and_port_come_from_ssh_config_when_the_inventory_leaves_them_out(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host 192.0.2.9\n  User deployer\n  Port 2222\n")
    monkeypatch.setenv("HOME", str(home))
    inv = _inventory(tmp_path, {"engine": "command", "gpus": 0, "argv": ["/usr/bin/true"]})
    remote = Remote(load_plan(str(inv), memory=False).inventory.hosts["box"])
    assert (remote.conn.user, remote.conn.port) == ("deployer", 2222)
    assert remote.known_name == "[192.0.2.9]:2222"
    assert os.path.expanduser("~") == str(home)
