"""The role library and templates in the package: an inventory in any folder plans with them, a role
file (or template) of the same name in its own roles_dir (templates_dir) wins, and a roles_dir it
names but that is not there is a problem with its line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpudeploy.errors import InputError
from gpudeploy.library import PACKAGED_ROLES, PACKAGED_TEMPLATES, available_roles
from gpudeploy.plan import load_plan

HOST = {"address": "192.0.2.7", "numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-7"},
                                               {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "8-15"}]}
DEFAULTS = {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}}


def inventory(root: Path, roles: list[object], **top: object) -> Path:
    path = root / "inventory" / "hosts.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"deployment": "lib", **top, "defaults": DEFAULTS,
                                    "hosts": {"n1": {**HOST, "roles": roles}}}))
    return path


def test_an_inventory_alone_plans_with_the_packaged_roles_and_templates(tmp_path: Path) -> None:
    plan = load_plan(str(inventory(tmp_path, ["prefill", "decode", "router"])), memory=False)
    files = {u.role.name: Path(u.role.file) for u in plan.units}
    assert files == {n: PACKAGED_ROLES / f"{n}.yml" for n in ("prefill", "decode", "router")}
    unit = next(u for u in plan.units if u.role.name == "decode")
    assert unit.files[unit.unit_path].startswith("# gpudeploy-lib.decode.service: rendered by gpudeploy")
    assert "--disaggregation-mode" in unit.argv and unit.gpus == (4, 5, 6, 7)


def test_a_role_or_template_of_the_inventorys_own_overrides_the_packaged_one(tmp_path: Path) -> None:
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "decode.yml").write_text(
        "engine: sglang\ntp_size: 4\nmodel: {path: /models/mine}\nsettings: {disaggregation_mode: decode}\n")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "engine.env.j2").write_text("# mine\n{% for k, v in env %}{{ k }}={{ v }}\n{% endfor %}")
    plan = load_plan(str(inventory(tmp_path, ["prefill", "decode"])), memory=False)
    dec = next(u for u in plan.units if u.role.name == "decode")
    pre = next(u for u in plan.units if u.role.name == "prefill")
    assert dec.role.file == str(tmp_path / "roles" / "decode.yml") and "/models/mine" in dec.argv
    assert pre.role.file == str(PACKAGED_ROLES / "prefill.yml")
    assert dec.files[dec.env_path].startswith("# mine\n")  # the inventory's template ...
    assert "[Service]" in dec.files[dec.unit_path]  # ... and the packaged one it does not override
    listed = {r.name: r for r in available_roles(tmp_path / "roles")}
    assert listed["decode"].overrides and listed["decode"].source == str(tmp_path / "roles")
    assert listed["prefill"].source == "packaged" and not listed["prefill"].overrides


def test_a_roles_dir_that_is_not_there_is_a_problem_with_its_line(tmp_path: Path) -> None:
    path = inventory(tmp_path, ["prefill"], roles_dir="../my-roles", templates_dir="../my-templates")
    with pytest.raises(InputError) as err:
        load_plan(str(path), memory=False)
    text = str(err.value)
    assert f"hosts.yml:{path.read_text().splitlines().index('roles_dir: ../my-roles') + 1}: key roles_dir: " \
           f"{tmp_path / 'my-roles'} is not a directory" in text, text
    assert "key templates_dir:" in text and "leave templates_dir out to use the packaged templates only" in text


def test_an_unknown_role_lists_the_packaged_and_the_inventorys_roles(tmp_path: Path) -> None:
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "mine.yml").write_text("engine: command\nargv: [/bin/true]\n")
    with pytest.raises(InputError) as err:
        load_plan(str(inventory(tmp_path, ["decoder"])), memory=False)
    assert "unknown role 'decoder'" in str(err.value)
    assert "known roles: command, decode, mine, prefill, router, vllm" in str(err.value), str(err.value)


def test_the_packaged_roles_and_templates_are_the_ones_the_package_names() -> None:
    assert sorted(p.stem for p in PACKAGED_ROLES.glob("*.yml")) == ["command", "decode", "prefill", "router", "vllm"]
    assert sorted(p.name for p in PACKAGED_TEMPLATES.glob("*.j2")) == ["engine.env.j2", "engine.service.j2",
                                                                         "slurm.batch.j2"]


def test_the_packaged_vllm_role_placed_three_times_is_three_servers(tmp_path: Path) -> None:
    plan = load_plan(str(inventory(tmp_path, [{"role": "vllm", "name": "vllm-a", "gpus": [0]},
                                              {"role": "vllm", "name": "vllm-b", "gpus": [4], "port": 18100},
                                              {"role": "vllm", "name": "vllm-c"}])), memory=False)
    units = {u.role.name: u for u in plan.units}
    assert sorted(units) == ["vllm-a", "vllm-b", "vllm-c"]
    a, b, c = units["vllm-a"], units["vllm-b"], units["vllm-c"]
    assert (a.gpus, b.gpus, c.gpus) == ((0,), (4,), (1,))
    assert (a.ports["http"], b.ports["http"], c.ports["http"]) == (18000, 18100, 18020)
    assert a.argv[a.argv.index("--port") + 1] == "18000" and b.argv[b.argv.index("--port") + 1] == "18100"
    assert a.argv[a.argv.index("--tensor-parallel-size") + 1] == "1"
    assert a.env["CUDA_VISIBLE_DEVICES"] == "0" and b.env["CUDA_VISIBLE_DEVICES"] == "4"
    assert a.name == "gpudeploy-lib.vllm-a.service" and a.role.file_role == "vllm"
    assert "TMPDIR=/var/lib/gpudeploy/lib.vllm-b" in b.argv  # each instance its own state directory
