"""The package's shape: folders depend on each other one way, and the product never imports the lab."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gpudeploy"


def _node(module: str) -> str:
    """A folder of the package (plan, apply, ...) or a module at its top (model, errors, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gpudeploy"


def _imports() -> dict[str, set[str]]:
    """module -> every gpudeploy/gpudeploy_lab module it imports (at any depth of the file)."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}
        graph[module] = {m for m in found if m.split(".")[0] in ("gpudeploy", "gpudeploy_lab")}
    return graph


def test_nothing_in_the_product_imports_the_lab() -> None:
    offenders = {m: sorted(i for i in deps if i.startswith("gpudeploy_lab")) for m, deps in _imports().items()}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_folders_depend_on_each_other_one_way() -> None:
    modules = set(_imports())
    edges: dict[str, set[str]] = {}
    for module, deps in _imports().items():
        src = _node(module)
        for dep in deps:
            real = dep if dep in modules else dep.rsplit(".", 1)[0]
            if real in modules and _node(real) != src:
                edges.setdefault(src, set()).add(_node(real))
    # Depth-first search for a cycle between folders (or top-level modules).
    state: dict[str, str] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = "open"
        for m in sorted(edges.get(n, ())):
            if state.get(m) == "open":
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(m):], m]))
            if m not in state:
                visit(m, [*path, m])
        state[n] = "done"

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])



def test_k8s_renders_from_the_plan_and_touches_nothing() -> None:
    """k8s/ turns a plan into manifests: it reads the plan, the model and the errors, never a host
    (no remote, facts, apply, verify or supervisor) and never a cluster."""
    graph = _imports()
    modules = set(graph)
    used = {_node(real) for module, deps in graph.items() if _node(module) == "k8s"
            for dep in deps for real in [dep if dep in modules else dep.rsplit(".", 1)[0]] if real in modules}
    assert used <= {"k8s", "plan", "model", "errors"}, used


def test_the_memory_model_is_pure() -> None:
    """memory/ is the startup-memory model: it reads nothing but its inputs (and a model directory's
    config.json and its checkpoint's safetensors index or headers when asked),
    so it imports no other folder of the package but the error tree; plan/
    calls it, never the other way round."""
    graph = _imports()
    modules = set(graph)
    used = {_node(real) for module, deps in graph.items() if _node(module) == "memory"
            for dep in deps for real in [dep if dep in modules else dep.rsplit(".", 1)[0]] if real in modules}
    assert used <= {"memory", "errors"}, used
    stdlib_only = {"json", "math", "re", "collections", "dataclasses", "typing", "pathlib", "__future__",
                   "struct"}  # struct: a safetensors header's length
    for path in (SRC / "memory").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib_only or top == "gpudeploy", f"{path.name} imports {name}"


def test_a_deploy_that_starts_nothing_imports_neither_the_gate_nor_an_http_client() -> None:
    """What only a unit's start, a roll or a router's smoke uses is imported when one happens (issue
    26): the gate with its causes' hundreds of patterns, tenacity, http.client and urllib. A deploy
    that changes nothing imported them all before: ~0.02-0.04 s more of a 3-host redeploy's CPU, on
    the cores the hosts' sessions need too."""
    import subprocess
    import sys

    # what `invoke deploy` imports before it knows whether anything will start
    code = ("import sys; import gpudeploy.cli.tasks, gpudeploy.apply.deployment, gpudeploy.apply.early_locks, "
            "gpudeploy.apply.results, gpudeploy.report, gpudeploy.remote.closing; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=SRC.parent).stdout.split())
    assert "gpudeploy.apply.deployment" in loaded
    assert loaded & {"gpudeploy.verify.gate", "gpudeploy.verify.causes", "gpudeploy.verify.http",
                     "gpudeploy.verify.smoke", "gpudeploy.verify.router_api", "tenacity", "http.client",
                     "urllib.request"} == set()
