"""The documentation against the code: every key the readers accept and every cause the gate can name
has its entry, the examples and log lines shown are true, the generated pages are current, and the
README stays a front page.

docs/gen.py writes the key reference, the troubleshooting page and the commands' flag tables from the
code's tables and docs/keys.yml / docs/causes.yml; these tests are what keeps the two in step.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpudeploy import inventory as inv
from gpudeploy import library
from gpudeploy.errors import InputError, Problem
from gpudeploy.experiment.spec import load_experiment
from gpudeploy.memory.modelfacts import model_facts_from_mapping
from gpudeploy.verify.causes import LOG_FORMATS, classify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGED_ROLES = library.PACKAGED_ROLES  # wherever the package keeps them (roles/ at the top maps there)
README_MAX_LINES = 200


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen", DOCS / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_gen"] = module
    spec.loader.exec_module(module)
    return module


gen = _gen()
KEYS = gen.load_keys()
CAUSES = gen.load_causes()


# ---- the README --------------------------------------------------------------------------------

def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move the detail into docs/")


def test_the_readme_links_only_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
    assert targets, "the README links into the documentation"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


# ---- keys --------------------------------------------------------------------------------------

@pytest.mark.parametrize("section", sorted(gen.code_keys()))
def test_every_key_the_code_accepts_has_its_reference_entry(section: str) -> None:
    code = gen.code_keys()[section]
    documented = set(KEYS.get(section, {}))
    assert not code - documented, (
        f"keys the code accepts in `{section}` without an entry in docs/keys.yml: {sorted(code - documented)}")
    assert not documented - code, (
        f"docs/keys.yml documents keys `{section}` no longer has: {sorted(documented - code)}")


def test_every_key_entry_says_its_type_default_example_and_meaning() -> None:
    bad = [f"{section}.{key}: {field}" for section, keys in KEYS.items() for key, e in keys.items()
           for field in ("default", "example", "doc") if not str(e.get(field, "")).strip()]
    bad += [f"{section}.{key}: type" for section, keys in KEYS.items() for key, e in keys.items()
            if "type" not in e and "choices" not in e]
    assert not bad, f"docs/keys.yml entries lacking a field: {bad}"


def test_the_reference_pages_have_an_entry_for_every_key() -> None:
    pages = {"reference.md": gen.INVENTORY_SECTIONS + gen.ROLE_SECTIONS, "experiments.md": gen.EXPERIMENT_SECTIONS,
             "slurm.md": gen.SLURM_SECTIONS}
    for page, sections in pages.items():
        text = (DOCS / page).read_text()
        for _, anchor, _, keys, compact in sections:
            for key in keys:
                entry = f"| `{key}` |" if compact else f"{{ #{anchor}-{key} }}"
                assert entry in text, f"docs/{page} has no entry for {anchor}: {key}; run `python docs/gen.py`"


# Where each section's example goes in a small valid inventory (and its roles): every example must load.
def _scaffold(tmp: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    (tmp / "inventory").mkdir()
    (tmp / "templates").mkdir()
    (tmp / "roles").mkdir()
    hosts = {"deployment": "pd", "roles_dir": "../roles",
             "defaults": {"gpu_memory_gib": 95.6, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
             "hosts": {"node1": {"address": "10.0.0.1", "ssh": {"user": "root"},
                                 "numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"},
                                                {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "32-63"}],
                                 "roles": [{"role": "prefill", "numa_node": 0}, {"role": "decode", "numa_node": 1},
                                           "router", "command"]}}}
    roles = {name: yaml.safe_load((PACKAGED_ROLES / f"{name}.yml").read_text())
             for name in ("prefill", "decode", "router", "command")}
    return hosts, roles


def _load(tmp: Path, hosts: dict[str, Any], roles: dict[str, dict[str, Any]]) -> list[Problem]:
    (tmp / "inventory" / "hosts.yml").write_text(yaml.safe_dump(hosts))
    for name, data in roles.items():
        (tmp / "roles" / f"{name}.yml").write_text(yaml.safe_dump(data))
    problems: list[Problem] = []
    try:
        inv.load_inventory(tmp / "inventory" / "hosts.yml", problems)
    except InputError as exc:
        problems += exc.problems
    return problems


ROLE_OF = {"argv": "command", "upstreams": "router", "smoke": "router", "service_discovery": "router"}
INVENTORY_EXAMPLES = [(s, k) for s in ("inventory", "host", "ssh", "numa_node", "placement", "kubernetes", "role",
                                       "model", "health", "smoke") for k in KEYS[s]]


@pytest.mark.parametrize(("section", "key"), INVENTORY_EXAMPLES, ids=[f"{s}.{k}" for s, k in INVENTORY_EXAMPLES])
def test_each_inventory_and_role_example_loads(tmp_path: Path, section: str, key: str) -> None:
    hosts, roles = _scaffold(tmp_path)
    example = yaml.safe_load(KEYS[section][key]["example"])
    assert isinstance(example, dict) and list(example) == [key], f"the example of {section}.{key} sets {key}"
    host = hosts["hosts"]["node1"]
    role = roles[ROLE_OF.get(key, "decode")]
    target = {"inventory": hosts, "host": host, "ssh": host["ssh"], "numa_node": host["numa_nodes"][1],
              "placement": host["roles"][1], "role": role, "model": role.setdefault("model", {}),
              "health": role.setdefault("health", {}), "smoke": roles["router"].setdefault("smoke", {})}
    if section == "kubernetes":
        where = host if key in gen.code_keys()["kubernetes"] - {*roles_only()} else role
        target["kubernetes"] = where.setdefault("kubernetes", {})
    target[section].update(copy.deepcopy(example))
    assert _load(tmp_path, hosts, roles) == [], f"the example of {section}.{key} does not load"


def roles_only() -> set[str]:
    from gpudeploy import k8sinventory

    return set(k8sinventory.ROLE_KEYS - k8sinventory.HOST_KEYS)


def test_each_model_facts_example_is_accepted() -> None:
    # enough of a shape for every kind (an MLA model needs its ranks, a hybrid one its layout)
    base = {"name": "m", "weights_gib": 10, "layers": 4, "kv_heads": 2, "head_dim": 64, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "full_attention_layers": 1, "linear_layers": 3, "state_bytes_per_request": 4096}
    for key, e in KEYS["facts"].items():
        model_facts_from_mapping({**base, **yaml.safe_load(e["example"])}, f"docs/keys.yml facts.{key}")


EXPERIMENT_EXAMPLES = [(s, k) for s in ("experiment", "variant", "benchmark", "choose") for k in KEYS[s]]


@pytest.mark.parametrize(("section", "key"), EXPERIMENT_EXAMPLES, ids=[f"{s}.{k}" for s, k in EXPERIMENT_EXAMPLES])
def test_each_experiment_example_loads(tmp_path: Path, section: str, key: str) -> None:
    hosts, roles = _scaffold(tmp_path)
    _load(tmp_path, hosts, roles)
    (tmp_path / "experiments" / "tuned" / "moe-configs").mkdir(parents=True)
    (tmp_path / "experiments" / "tuned" / "moe-configs" / "E=8.json").write_text("{}")
    exp: dict[str, Any] = {"inventory": "../inventory/hosts.yml",
                           "variants": {"base": {"decode": {"settings": {"chunked_prefill_size": 4096}}}},
                           "benchmark": {"concurrency": [1, 4]}, "choose": {}}
    target = {"experiment": exp, "variant": exp["variants"]["base"]["decode"], "benchmark": exp["benchmark"],
              "choose": exp["choose"]}
    target[section].update(yaml.safe_load(KEYS[section][key]["example"]))
    if "search" in exp:  # a file holds variants/grid (experiment) or search (tune), not both
        del exp["variants"]
    path = tmp_path / "experiments" / "x.yml"
    path.write_text(yaml.safe_dump(exp))
    load_experiment(path)  # raises InputError, with every problem, when the example is wrong


def _typed(text: Any) -> Any:
    value = yaml.safe_load(str(text))
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def test_the_documented_defaults_are_what_the_readers_apply(tmp_path: Path) -> None:
    hosts, roles = _scaffold(tmp_path)
    roles["decode"] = {"engine": "sglang", "model": {"path": "/models/x"}}
    roles["router"] = {"engine": "sglang_router", "upstreams": {"prefill": ["prefill"], "decode": ["decode"]}}
    del hosts["deployment"]
    del hosts["hosts"]["node1"]["ssh"]
    assert _load(tmp_path, hosts, roles) == []
    loaded = inv.load_inventory(tmp_path / "inventory" / "hosts.yml")
    host, decode, router = loaded.hosts["node1"], loaded.roles["decode"], loaded.roles["router"]
    assert router.smoke is not None
    applied = {
        ("inventory", "deployment"): loaded.deployment,
        ("host", "python"): host.python, ("host", "bind_address"): host.bind_address,
        ("host", "numa_policy"): host.numa_policy, ("host", "supervisor"): host.supervisor,
        ("host", "connection"): host.connection, ("ssh", "connect_timeout_s"): host.ssh.connect_timeout_s,
        ("role", "tp_size"): decode.tp_size, ("role", "nnodes"): decode.nnodes,
        ("role", "stop_timeout_s"): decode.stop_timeout_s, ("role", "log_format"): decode.log_format,
        ("role", "allow_span_numa"): decode.allow_span_numa,
        ("health", "timeout_s"): decode.health.timeout_s, ("health", "interval_s"): decode.health.interval_s,
        ("health", "drain_s"): decode.health.drain_s, ("health", "on_stall"): decode.health.on_stall,
        ("smoke", "endpoint"): router.smoke.endpoint, ("smoke", "prompt"): router.smoke.prompt,
        ("smoke", "max_tokens"): router.smoke.max_tokens, ("smoke", "timeout_s"): router.smoke.timeout_s,
    }
    wrong = {f"{s}.{k}": (KEYS[s][k]["default"], value) for (s, k), value in applied.items()
             if _typed(KEYS[s][k]["default"]) != _typed(value)}
    assert not wrong, f"docs/keys.yml default vs what the reader applies: {wrong}"


# ---- causes ------------------------------------------------------------------------------------

def test_every_cause_the_gate_can_name_has_its_troubleshooting_entry() -> None:
    kinds = gen.all_cause_kinds()
    assert {"kv-pool-empty", "timeout", "stalled", "exited-without-message"} <= kinds  # the table is found
    assert not kinds - set(CAUSES), f"causes without an entry in docs/causes.yml: {sorted(kinds - set(CAUSES))}"
    assert not set(CAUSES) - kinds, f"docs/causes.yml has entries for no cause: {sorted(set(CAUSES) - kinds)}"


def test_the_troubleshooting_page_has_a_section_per_cause() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    missing = [k for k in gen.all_cause_kinds() if f"## `{k}` {{ #{k} }}" not in text]
    assert not missing, f"docs/troubleshooting.md lacks {missing}; run `python docs/gen.py`"


def test_each_cause_entry_says_what_it_means_and_shows_it() -> None:
    rules = gen.rule_causes()
    bad = [k for k, e in CAUSES.items() if not str(e.get("means", "")).strip()]
    bad += [k for k, e in CAUSES.items() if k in rules and not e.get("lines")]
    bad += [k for k, e in CAUSES.items() if k not in rules and not (e.get("summary") and e.get("change"))]
    assert not bad, f"docs/causes.yml entries lacking what it means, its lines, or its summary and change: {bad}"


LINES = [(kind, fmt, text) for kind, e in CAUSES.items() for fmt, text in (e.get("lines") or {}).items()]


@pytest.mark.parametrize(("kind", "fmt", "text"), LINES, ids=[f"{k}-{f}" for k, f, _ in LINES])
def test_the_log_lines_shown_for_a_cause_are_given_that_cause(kind: str, fmt: str, text: str) -> None:
    cause = classify(text.splitlines(), exited=True, fmt=LOG_FORMATS[fmt])
    assert cause is not None and cause.kind == kind, f"docs/causes.yml: {kind}'s {fmt} lines are named " \
        f"{cause.kind if cause else None}"


# ---- the generated pages -----------------------------------------------------------------------

def test_the_generated_pages_are_what_the_code_says_now() -> None:
    gens = gen.generators()
    stale = [p.name for p in gen.pages() if gen.render(p.read_text(), gens, p.name) != p.read_text()]
    assert not stale, f"stale generated docs: {stale}; run `python docs/gen.py`"


def test_the_generator_fills_a_block_it_is_given() -> None:
    page = "# x\n\n<!-- gen:options:teardown -->\nold text\n<!-- /gen:options:teardown -->\n"
    out = gen.render(page, gen.generators(), "x.md")
    assert "old text" not in out and "`--purge`" in out and out.endswith("<!-- /gen:options:teardown -->\n")


def test_the_site_config_names_every_page() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")}
    missing = [p for p in pages if p not in config]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"
