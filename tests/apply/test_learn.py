"""Learning a release's flags from a host: kept by release and the help text's digest with the host
that taught it, refused when the host cannot tell its release, and no host's help text replaces
another's. The host is a recorded probe answer; the plan reads the cache on this machine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy import flagcache
from gpudeploy.apply import learn as learning
from gpudeploy.errors import InputError, RemoteError
from gpudeploy.inventory import load_inventory
from gpudeploy.plan import load_plan
from gpudeploy.plan.flags import FlagsNotKnown
from gpudeploy.report import plan_json, plan_text

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "src" / "gpudeploy" / "data"
PY = "/opt/sglang/.venv/bin/python"


def inventory(tmp_path: Path, hosts: list[str], release: str = "0.5.99") -> Path:
    inv = tmp_path / "hosts.yml"
    body = "".join(f"""\
  {h}:
    address: 10.0.0.{i + 1}
    numa_nodes: [{{id: 0, gpus: [0, 1, 2, 3], cpus: "0-31"}}]
    roles: [decode]
""" for i, h in enumerate(hosts))
    inv.write_text(f"""\
deployment: t
roles_dir: {REPO / 'roles'}
defaults:
  gpu_memory_gib: 95.6
  engine_versions: {{sglang: "{release}", sglang_router: "0.3.2"}}
  python: {PY}
hosts:
{body}""")
    return inv


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "flags"
    monkeypatch.setattr(flagcache, "ROOT", folder)
    return folder


def host_answers(monkeypatch: pytest.MonkeyPatch, answers: dict[str, dict[str, Any]]) -> None:
    """Each host's probe answer: {"release": what its engine reports (None: cannot tell), "help": text}."""
    @contextmanager
    def connect(host: Any) -> Iterator[Any]:
        yield host

    def probe(remote: Any, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        a = answers[remote.name]
        return {"versions": {PY: {"sglang": a["release"]}},
                "help": {f"{PY} sglang.launch_server": {"rc": 0, "text": a["help"]}}}

    monkeypatch.setattr(learning, "connect", connect)
    monkeypatch.setattr(learning, "probe", probe)


def needed(inv: Path) -> list[FlagsNotKnown]:
    with pytest.raises(InputError) as exc:
        load_plan(str(inv), memory=False)
    found = [p for p in exc.value.problems if isinstance(p, FlagsNotKnown)]
    assert found and len(found) == len(exc.value.problems), exc.value
    return found


def argv_on(inv: Path, host: str) -> list[str]:
    return list(next(u for u in load_plan(str(inv), memory=False).units if u.host.name == host).argv)


HELP_0510 = (DATA / "sglang-0.5.10-launch_server-help.txt").read_text()
HELP_0523 = (DATA / "sglang-0.5.23-launch_server-help.txt").read_text()


def test_a_help_text_whose_release_the_host_cannot_tell_is_refused_and_not_kept(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: "accepted when the version is unknown": the text was filed as 0.5.99's for every host.
    inv = inventory(tmp_path, ["n1"])
    host_answers(monkeypatch, {"n1": {"release": None, "help": HELP_0510}})
    with pytest.raises(RemoteError) as exc:
        learning.learn(load_inventory(inv), needed(inv))
    assert "n1: cannot read which sglang release" in str(exc.value), exc.value
    assert flagcache.entries("sglang") == []
    assert needed(inv)  # still unknown: the next deploy asks the host again


def test_what_is_learned_names_its_host_and_plan_shows_it(tmp_path: Path, cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(tmp_path, ["n1", "n2"])
    host_answers(monkeypatch, {"n1": {"release": "0.5.99", "help": HELP_0510},
                               "n2": {"release": "0.5.99", "help": HELP_0510}})
    assert learning.learn(load_inventory(inv), needed(inv)) == ["sglang 0.5.99"]  # one host reads it
    [entry] = flagcache.entries("sglang")
    assert entry.release == "0.5.99" and [h for h, _ in entry.hosts] == ["n1"]
    meta = json.loads(next(cache.glob("sglang/*.json")).read_text())
    assert meta["digest"] == flagcache.digest_of(HELP_0510) and set(meta["hosts"]) == {"n1"}
    plan = load_plan(str(inv), memory=False)
    text = plan_text(plan, show_files=False)
    assert re.search(r"flags +of sglang 0\.5\.99 learned from n1 on \d{4}-\d\d-\d\d \d\d:\d\d UTC; help text "
                     r"sha256 [0-9a-f]{12}", text), text
    [doc] = [u for u in plan_json(plan)["units"] if u["host"] == "n2"]
    assert doc["flags"]["source"] == "learned" and doc["flags"]["learned_from"] == "n1", doc["flags"]
    assert doc["flags"]["sha256"] == flagcache.digest_of(HELP_0510)


def test_another_hosts_help_of_the_same_release_never_replaces_what_a_host_taught(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # n1 taught 0.5.99 with 0.5.10's options; n2 then prints 0.5.23's under the same release. Before,
    # one file per release: n2's replaced n1's, and n1's units were rendered with n2's flags.
    flagcache.save("sglang", "0.5.99", HELP_0510, "n1")
    flagcache.save("sglang", "0.5.99", HELP_0523, "n2")
    inv = inventory(tmp_path, ["n1", "n2"])
    assert "--cuda-graph-max-bs" in argv_on(inv, "n1") and "--cuda-graph-max-bs-decode" not in argv_on(inv, "n1")
    assert "--cuda-graph-max-bs-decode" in argv_on(inv, "n2")
    # a third host of that release: which text is its own is not known, so deploy reads its own
    inv3 = inventory(tmp_path, ["n1", "n2", "n3"])
    [n3] = needed(inv3)
    assert n3.host == "n3" and n3.own and "hosts printed different --help texts of sglang 0.5.99" in n3.message
    host_answers(monkeypatch, {"n3": {"release": "0.5.99", "help": HELP_0523}})
    assert learning.learn(load_inventory(inv3), [n3]) == ["sglang 0.5.99"]
    assert "--cuda-graph-max-bs-decode" in argv_on(inv3, "n3")
    assert {h for e in flagcache.entries("sglang") for h, _ in e.hosts} == {"n1", "n2", "n3"}


def test_a_host_reporting_another_release_is_refused(tmp_path: Path, cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(tmp_path, ["n1"])
    host_answers(monkeypatch, {"n1": {"release": "0.5.98", "help": HELP_0510}})
    with pytest.raises(RemoteError) as exc:
        learning.learn(load_inventory(inv), needed(inv))
    assert "has sglang 0.5.98, not 0.5.99 as the inventory says" in str(exc.value)
    assert flagcache.entries("sglang") == []


def test_a_text_changed_since_it_was_learned_is_not_used(tmp_path: Path, cache: Path) -> None:
    entry = flagcache.save("sglang", "0.5.99", HELP_0510, "n1")
    entry.path.write_text(HELP_0523)  # edited, or another process wrote half of it
    assert flagcache.entries("sglang") == []
    assert needed(inventory(tmp_path, ["n1"]))
