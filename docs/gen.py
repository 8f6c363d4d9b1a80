"""The documentation's generated parts, written from the code so that they cannot drift.

    python docs/gen.py           rewrite every generated block in docs/*.md
    python docs/gen.py --check   exit 1, naming each stale page, when a block is not what the code says

A page holds hand-written prose and blocks between ``<!-- gen:NAME -->`` and ``<!-- /gen:NAME -->``
that only this script writes:

* ``keys:inventory``, ``keys:role``, ``keys:experiment``: every key of the code's own key tables
  (``inventory.TOP_KEYS``, ``HOST_KEYS``, ... , ``k8sinventory.ROLE_KEYS``, ``experiment.spec.BENCHMARK_KEYS``)
  with its type, default, an example and what it does (``docs/keys.yml``); choices and the stall
  defaults come from the code's tuples;
* ``causes``: every cause the health gate can name, from ``verify/causes.py``'s tables (its summary
  and advice in the words deploy prints) and ``docs/causes.yml`` (what it means, log lines that show it);
* ``options:TASK``: a command's flags, from the task collection the ``gpudeploy`` command runs.

Why a script whose output is committed, not a mkdocs hook that generates at build time: the pages
stay readable where they are (on GitHub, in an editor, linked from the README), a code change's
effect on the docs shows in its diff, and ``tests/docs/test_docs.py`` fails (naming this command)
when the committed text is not what the code says now, and when a key or a cause has no entry.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT / "src"))

from gpudeploy import inventory, k8sinventory  # noqa: E402
from gpudeploy.experiment import spec  # noqa: E402
from gpudeploy.memory import modelfacts  # noqa: E402
from gpudeploy.model import STALL_DEFAULTS_S  # noqa: E402
from gpudeploy.slurm import target as slurm_target  # noqa: E402
from gpudeploy.verify import causes  # noqa: E402

BLOCK = re.compile(r"(<!-- gen:(?P<name>[\w:.-]+) -->\n)(?P<body>.*?)(<!-- /gen:(?P=name) -->)", re.S)


# ---- the key tables ----------------------------------------------------------------------------

# (section of keys.yml, anchor, heading, the code's key set, compact: one table row per key)
Section = tuple[str, str, str, frozenset[str], bool]

INVENTORY_SECTIONS: tuple[Section, ...] = (
    ("inventory", "inventory", "The inventory file", frozenset(inventory.TOP_KEYS), False),
    ("host", "host", "A host: `hosts.<name>`", frozenset(inventory.HOST_KEYS), False),
    ("ssh", "ssh", "`ssh`", frozenset(inventory.SSH_KEYS), False),
    ("numa_node", "numa-node", "A NUMA node: `numa_nodes[]`", frozenset(inventory.NUMA_KEYS), False),
    ("placement", "placement", "A placement: `roles[]`", frozenset(inventory.PLACEMENT_KEYS), False),
    ("kubernetes", "kubernetes-inventory", "`kubernetes` (defaults, a host)", frozenset(k8sinventory.HOST_KEYS),
     True),
)
ROLE_SECTIONS: tuple[Section, ...] = (
    ("role", "role", "A role file: `roles/<name>.yml`", frozenset(inventory.ROLE_KEYS), False),
    ("model", "model", "`model`", frozenset(inventory.SGLANG_MODEL_KEYS), False),
    # the memory model's accepted facts (the module keeps its table private; this script reads it)
    ("facts", "modelfacts", "`model.facts`", frozenset(modelfacts._MAPPING_KEYS), True),
    ("health", "health", "`health`", frozenset(inventory.HEALTH_KEYS), False),
    ("smoke", "smoke", "`smoke` (routers)", frozenset(inventory.SMOKE_KEYS), False),
    ("kubernetes", "kubernetes-role", "`kubernetes` (a role)", frozenset(k8sinventory.ROLE_KEYS), True),
)
EXPERIMENT_SECTIONS: tuple[Section, ...] = (
    ("experiment", "experiment", "The experiment file", frozenset(spec.EXPERIMENT_KEYS), False),
    ("variant", "variant", "A variant's overrides of a role", frozenset(inventory.OVERRIDABLE), True),
    ("benchmark", "benchmark", "`benchmark`", frozenset(spec.BENCHMARK_KEYS), True),
    ("choose", "choose", "`choose`", frozenset(spec.CHOOSE_KEYS), True),
)
SLURM_SECTIONS: tuple[Section, ...] = (
    ("slurm", "slurm", "`slurm` (a Slurm inventory)", frozenset(slurm_target.SLURM_KEYS), True),
    ("slurm_login", "slurm-login", "`slurm.login`", frozenset(slurm_target.LOGIN_KEYS), True),
)
ALL_SECTIONS = INVENTORY_SECTIONS + ROLE_SECTIONS + EXPERIMENT_SECTIONS + SLURM_SECTIONS
# a nested key's heading names its path (`health.timeout_s`, `roles[].port`): searchable and unambiguous
PATHS = {"ssh": "ssh.", "numa-node": "numa_nodes[].", "placement": "roles[].", "model": "model.",
         "health": "health.", "smoke": "smoke."}


# what a key without an entry in keys.yml shows (tests/docs fails on it; the page still builds)
MISSING = {"type": "UNDOCUMENTED", "default": "-", "example": "", "doc": "UNDOCUMENTED: add it to docs/keys.yml"}


def load_keys() -> dict[str, dict[str, dict[str, Any]]]:
    data: dict[str, dict[str, dict[str, Any]]] = yaml.safe_load((DOCS / "keys.yml").read_text())
    return data


def code_keys() -> dict[str, frozenset[str]]:
    """Every section of keys.yml -> the keys the code accepts there (kubernetes: inventory's and roles')."""
    out: dict[str, frozenset[str]] = {}
    for name, _, _, keys, _ in ALL_SECTIONS:
        out[name] = out.get(name, frozenset()) | keys
    return out


def _choices(ref: str) -> str:
    module, _, name = ref.partition(":")
    values: Iterable[str] = getattr(import_module(module), name)
    return "one of " + ", ".join(f"`{v}`" for v in values)


def _type(entry: dict[str, Any]) -> str:
    return _choices(entry["choices"]) if "choices" in entry else str(entry["type"])


def _default(value: Any) -> str:
    text = str(value)
    if text in ("-", "required") or " " in text or "`" in text or "](" in text:
        return text
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(sec: Section, entries: dict[str, dict[str, Any]]) -> list[str]:
    _, anchor, heading, code, compact = sec
    # keys.yml's order is the reading order; a key it lacks still gets its row (the test names it)
    keys = [k for k in entries if k in code] + sorted(code - set(entries))
    out = [f"## {heading} {{ #{anchor} }}", ""]
    if compact:
        out += ["| key | type | default | what it does | example |", "|---|---|---|---|---|"]
        for key in keys:
            e = entries.get(key, MISSING)
            out.append(f"| `{key}` | {_cell(_type(e))} | {_cell(_default(e['default']))} | {_cell(e['doc'])} | "
                       f"`{_cell(e['example'])}` |")
        return [*out, ""]
    out += ["| key | type | default |", "|---|---|---|"]
    for key in keys:
        e = entries.get(key, MISSING)
        out.append(f"| [`{key}`](#{anchor}-{key}) | {_cell(_type(e))} | {_cell(_default(e['default']))} |")
    out.append("")
    for key in keys:
        e = entries.get(key, MISSING)
        out += [f"### `{PATHS.get(anchor, '')}{key}` {{ #{anchor}-{key} }}", "",
                f"**Type:** {_type(e)} · **Default:** {_default(e['default'])}", "",
                " ".join(str(e["doc"]).split()), "", "```yaml", str(e["example"]), "```", ""]
    return out


def _defaults_section() -> list[str]:
    keys = sorted(inventory.DEFAULT_KEYS)
    return ["## `defaults` { #defaults }", "",
            "Every host takes these unless it sets its own (the host's value wins; `ssh`, `env` and "
            "`engine_versions` merge key by key): " + ", ".join(f"[`{k}`](#host-{k})" for k in keys) + ".", ""]


def _stall_section() -> list[str]:
    out = ["## `health.stall_s` { #healthstall_s }", "",
           "One number of seconds for every phase, or a mapping of phase to seconds; a phase left out keeps "
           "its default. The phases are the gate's, in order:", "",
           "| phase | default (s) |", "|---|---|"]
    out += [f"| `{phase.replace(' ', '_').lower()}` | {seconds:g} |" for phase, seconds in STALL_DEFAULTS_S.items()]
    return [*out, ""]


def _slo_section() -> list[str]:
    return ["## `slo` { #slo }", "",
            "Upper bounds in milliseconds, each more than 0; a level meets the SLO when it stays within every "
            "bound given. The metrics (median, p90 and p99 of time to first token, time per output token, "
            "inter-token latency and end-to-end latency): "
            + ", ".join(f"`{m}`" for m in spec.SLO_METRICS) + ".", ""]


def keys_block(which: str) -> str:
    entries = load_keys()
    out: list[str] = []
    if which == "inventory":
        for sec in INVENTORY_SECTIONS:
            out += _section(sec, entries[sec[0]])
            if sec[0] == "inventory":
                out += _defaults_section()
    elif which == "role":
        for sec in ROLE_SECTIONS:
            out += _section(sec, entries[sec[0]])
            if sec[0] == "health":
                out += _stall_section()
    elif which == "slurm":
        for sec in SLURM_SECTIONS:
            out += _section(sec, entries[sec[0]])
    elif which == "experiment":
        for sec in EXPERIMENT_SECTIONS:
            out += _section(sec, entries[sec[0]])
            if sec[0] == "benchmark":
                out += _slo_section()
    else:
        raise SystemExit(f"docs/gen.py: no key table {which!r}")
    return "\n".join(out)


# ---- the cause table ---------------------------------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def rule_causes() -> dict[str, dict[str, tuple[str, str]]]:
    """Cause kind -> log format -> (summary, next step), from the table's rules as deploy words them
    with the role's settings unknown (a real report shows your values)."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for fmt in causes.LOG_FORMATS.values():
        for rule in fmt.rules:
            out.setdefault(rule.kind, {})[fmt.name] = (rule.summary, rule.advice({}, _flag))
    for kind, summary, advice in causes.OOM_BY_PHASE.values():
        out.setdefault(kind, {}).setdefault("sglang", (summary, advice({}, _flag)))
    return out


def gate_cause_kinds() -> set[str]:
    """The kinds the code names outside the rules: every ``Cause("kind", ...)`` with a literal kind."""
    kinds: set[str] = set()
    for path in (ROOT / "src" / "gpudeploy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Cause" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and node.args[0].value:
                kinds.add(node.args[0].value)
    return kinds


def all_cause_kinds() -> set[str]:
    return set(rule_causes()) | gate_cause_kinds()


def load_causes() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load((DOCS / "causes.yml").read_text())
    return data


MISSING_CAUSE = {"summary": "UNDOCUMENTED", "change": "-", "means": "UNDOCUMENTED: add it to docs/causes.yml"}
LOG_FENCE = "```{.text .log}"
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def causes_block() -> str:
    entries = load_causes()
    rules = rule_causes()
    kinds = sorted(all_cause_kinds())
    out = ["| cause | engines | what deploy says |", "|---|---|---|"]
    entries = {k: entries.get(k, MISSING_CAUSE) for k in kinds}
    for kind in kinds:
        formats = ", ".join(ENGINE_NAMES[f] for f in rules.get(kind, {})) or "any"
        summary = next(iter(rules[kind].values()))[0] if kind in rules else entries[kind]["summary"]
        out.append(f"| [`{kind}`](#{kind}) | {formats} | {_cell(summary)} |")
    out.append("")
    for kind in kinds:
        e = entries[kind]
        out += [f"## `{kind}` {{ #{kind} }}", ""]
        # what deploy says (per engine family where the tables differ), what it means, the log lines
        # that show it, what to change: the order in which a reader goes from a report to a fix
        says = [(f"**{ENGINE_NAMES[f]}** (`log_format: {f}`)", summary, advice)
                for f, (summary, advice) in rules[kind].items()] if kind in rules else \
            [("**Any engine**", str(e["summary"]), " ".join(str(e["change"]).split()))]
        for who, summary, _ in says:
            out += [f"{who} says: {summary}.", ""]
        out += [" ".join(str(e["means"]).split()), ""]
        for fmt, text in (e.get("lines") or {}).items():
            # `.log`: the site wraps these long lines rather than scroll them (docs/stylesheets/extra.css)
            out += [f"Log lines that show it ({ENGINE_NAMES[fmt]}):", "", LOG_FENCE, str(text).rstrip("\n"), "```", ""]
        if e.get("shows"):
            out += ["What deploy prints:", "", LOG_FENCE, str(e["shows"]).rstrip("\n"), "```", ""]
        for who, _, advice in says:
            engine = "" if len(says) == 1 else f" ({who.split('**')[1]})"
            out += [f"**What to change{engine}**: {advice}.", ""]
    return "\n".join(out)


# ---- the commands' flags -----------------------------------------------------------------------

def _takes(kind: str) -> str:
    return {"bool": "", "list": " VALUE (repeat it)", "int": " INT"}.get(kind, " VALUE")


@functools.cache
def task_options() -> dict[str, list[dict[str, Any]]]:
    """Every task's options as its --help shows them, read in a fresh interpreter: invoke's
    ``Task.get_arguments`` pops each option's help off the task as it builds the parser, so in a
    process that has parsed a command line already (a test run) the help texts are gone."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, __file__, "--dump-options"], capture_output=True, text=True, env=env,
                         check=True).stdout
    data: dict[str, list[dict[str, Any]]] = json.loads(out)
    return data


def _dump_options() -> None:
    from gpudeploy.cli.tasks import collection

    tasks = collection()
    print(json.dumps({name: [{"names": list(a.names), "kind": getattr(a.kind, "__name__", str(a.kind)),
                              "help": a.help or ""} for a in tasks[name].get_arguments()]
                      for name in tasks.task_names}))


def options_block(task_name: str) -> str:
    out = ["| flag | what it does |", "|---|---|"]
    for arg in sorted(task_options()[task_name], key=lambda a: a["names"][0]):
        longs = [f"--{n}" for n in arg["names"] if len(n) > 1]
        shorts = [f"-{n}" for n in arg["names"] if len(n) == 1]
        flags = ", ".join(f"`{f}{_takes(arg['kind'])}`" for f in shorts + longs)
        out.append(f"| {flags} | {_cell(arg['help'])} |")
    return "\n".join([*out, ""])


# ---- the pages ---------------------------------------------------------------------------------

def generators() -> dict[str, Callable[[], str]]:
    out: dict[str, Callable[[], str]] = {
        "keys:inventory": lambda: keys_block("inventory"),
        "keys:role": lambda: keys_block("role"),
        "keys:experiment": lambda: keys_block("experiment"),
        "keys:slurm": lambda: keys_block("slurm"),
        "causes": causes_block,
    }
    for name in task_options():
        out[f"options:{name}"] = lambda name=name: options_block(name)
    return out


def render(text: str, gens: dict[str, Callable[[], str]], page: str) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in gens:
            raise SystemExit(f"{page}: no generator for block gen:{name} (known: {', '.join(sorted(gens))})")
        body = gens[name]().rstrip("\n") + "\n"
        return f"{m.group(1)}{body}{m.group(4)}"

    return BLOCK.sub(one, text)


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is stale")
    parser.add_argument("--dump-options", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump_options:
        _dump_options()
        return 0
    gens = generators()
    stale = []
    for path in pages():
        text = path.read_text()
        new = render(text, gens, str(path.relative_to(ROOT)))
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale generated docs: {', '.join(stale)}; run `python docs/gen.py`", file=sys.stderr)
        return 1
    if not args.check:
        print(f"docs/gen.py: {'rewrote ' + ', '.join(stale) if stale else 'every page is up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
