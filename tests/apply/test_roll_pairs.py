"""A roll never lets the router pair what the plan refuses, named instances are fronted like their
role file, and a planned unit is never taken for a rolling update's leftover copy (issue 43, items 1-3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpudeploy.apply import rolling, surges
from gpudeploy.apply.order import upstreams_of
from gpudeploy.apply.pair_roll import crossings
from gpudeploy.model import Unit
from gpudeploy.plan import load_plan
from gpudeploy.plan.pd import pair_facts
from gpudeploy.supervisor.base import UnitState

NUMA = [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"}, {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "32-63"}]


def plan_units(root: Path, placed: list[Any], *, model: str = "/models/a", backend: str = "mooncake") -> list[Unit]:
    (root / "roles").mkdir(parents=True, exist_ok=True)
    roles = {
        "pre": {"engine": "sglang", "tp_size": 2, "model": {"path": model},
                "settings": {"disaggregation_mode": "prefill", "disaggregation_transfer_backend": backend}},
        "dec": {"engine": "sglang", "tp_size": 2, "model": {"path": model},
                "settings": {"disaggregation_mode": "decode", "disaggregation_transfer_backend": backend}},
        "rt": {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]}},
    }
    for name, role in roles.items():
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role))
    inv = {"deployment": "pd", "roles_dir": "roles",
           "defaults": {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
           "hosts": {"node1": {"address": "192.0.2.1", "numa_nodes": NUMA, "roles": placed}}}
    (root / "hosts.yml").write_text(yaml.safe_dump(inv))
    return list(load_plan(str(root / "hosts.yml"), memory=False).units)


def running(units: list[Unit], records: dict[str, dict[str, Any] | None]) -> dict[str, UnitState]:
    return {u.name: UnitState(u.name, True, "active", "running", 100, "inv", False, "",
                              record=records.get(u.name)) for u in units}


def by_role(units: list[Unit], name: str) -> Unit:
    return next(u for u in units if u.role.name == name)


def test_a_new_checkpoint_on_both_sides_cannot_roll_past_the_old_decode(tmp_path: Path) -> None:
    old = plan_units(tmp_path / "old", ["pre", "dec", "rt"], model="/models/a")
    new = plan_units(tmp_path / "new", ["pre", "dec", "rt"], model="/models/b")
    states = running(new, {u.name: {"state": "ready", "pair": pair_facts(u)} for u in old})
    engines = [u for u in new if u.role.engine == "sglang"]
    lines = crossings(new, engines, states)
    assert lines == ["new prefill node1/pre with decode node1/dec as it runs now serve different models: model.path "
                     "'/models/b' vs '/models/a'; the decode server would receive KV of another model"]


def test_a_change_that_keeps_the_pair_compatible_rolls(tmp_path: Path) -> None:
    old = plan_units(tmp_path / "old", ["pre", "dec", "rt"])
    new = plan_units(tmp_path / "new", ["pre", "dec", "rt"])  # e.g. only an env value changed
    states = running(new, {u.name: {"pair": pair_facts(u)} for u in old})
    assert crossings(new, [u for u in new if u.role.engine == "sglang"], states) == []
    # One side alone changed: the other runs as planned, and the plan checked that pair.
    states = running(new, {})
    assert crossings(new, [by_role(new, "dec")], states) == []


def test_a_decode_whose_run_record_predates_pair_records_is_not_assumed_compatible(tmp_path: Path) -> None:
    new = plan_units(tmp_path / "new", ["pre", "dec", "rt"], backend="nixl")
    lines = crossings(new, [by_role(new, "pre"), by_role(new, "dec")], running(new, {}))
    assert len(lines) == 1 and "the pair cannot be checked" in lines[0]


def test_a_named_decode_instance_is_fronted_as_a_decode_worker(tmp_path: Path) -> None:
    units = plan_units(tmp_path, ["pre", {"role": "dec", "name": "dec-a", "gpus": [4, 5]}, "rt"])
    router = by_role(units, "rt")
    assert sorted((u.role.name, kind) for u, kind in upstreams_of(router, units)) == [
        ("dec-a", "decode"), ("pre", "prefill")]
    assert "--decode" in router.argv  # the router's own argv fronts it, by the same rule


def test_a_named_decode_instance_crossing_is_found_too(tmp_path: Path) -> None:
    placed = ["pre", {"role": "dec", "name": "dec-a", "gpus": [4, 5]}, "rt"]
    old = plan_units(tmp_path / "old", placed, model="/models/a")
    new = plan_units(tmp_path / "new", placed, model="/models/b")
    states = running(new, {u.name: {"pair": pair_facts(u)} for u in old})
    lines = crossings(new, [u for u in new if u.role.engine == "sglang"], states)
    assert len(lines) == 1 and "decode node1/dec-a as it runs now serve different models" in lines[0]


def test_a_planned_unit_is_never_a_leftover_surge_copy(tmp_path: Path) -> None:
    units = plan_units(tmp_path, ["pre", "dec", "rt"])
    dec = by_role(units, "dec")
    # Pretend a planned unit carries the copy's name (the inventory refuses such a name; this holds anyway).
    fake = [*units, Unit(**{**dec.__dict__, "name": surges.surge_name(dec)})]
    where = surges.Where(remote=None, supervisor=None, states=running(fake, {}), facts={})  # type: ignore[arg-type]
    assert surges.left(fake, {"node1": where}) == []
    assert surges.surge_name(dec) not in surges.probe_names(fake, "node1")


def test_a_named_instance_gets_a_surge_copy_planned_like_itself(tmp_path: Path) -> None:
    # Found on the lab: the copy of dec-a was planned as a role file of its own, and planned nothing.
    units = plan_units(tmp_path, ["pre", {"role": "dec", "name": "dec-a", "gpus": [4, 5]}, "rt"])
    plan = load_plan(str(tmp_path / "hosts.yml"), memory=False)
    dec_a = by_role(units, "dec-a")
    surge = rolling.surge_unit(plan, dec_a, dec_a.host, (6, 7))
    assert surge.role.name == "dec-a-surge" and surge.gpus == (6, 7)
    assert surge.ports["http"] == dec_a.ports["http"] + 1000
