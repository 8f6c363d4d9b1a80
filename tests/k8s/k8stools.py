"""Helpers for the k8s tests: an inventory with roles written to a temporary directory, and the
rendered YAML read back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]

HOST = {"numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-15"},
                       {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "16-31"}]}
DEFAULTS = {"gpu_memory_gib": 141, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"},
            "python": "/opt/sglang/venv/bin/python"}
MODEL = {"path": "/models/Qwen3-8B"}
PREFILL = {"engine": "sglang", "tp_size": 4, "model": MODEL,
           "settings": {"disaggregation_mode": "prefill"}, "health": {"timeout_s": 900}}
DECODE = {"engine": "sglang", "tp_size": 4, "model": MODEL, "settings": {"disaggregation_mode": "decode"}}
ROUTER = {"engine": "sglang_router", "upstreams": {"prefill": ["prefill"], "decode": ["decode"]}}


def write_inventory(root: Path, hosts: dict[str, dict[str, Any]], roles: dict[str, dict[str, Any]],
                    deployment: str = "t", defaults: dict[str, Any] | None = None) -> str:
    """``hosts``: name -> {address, roles, ...} (NUMA nodes default to two of four GPUs each)."""
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name, role in roles.items():
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role, sort_keys=False))
    inventory = {"deployment": deployment, "roles_dir": "roles",
                 "defaults": {**DEFAULTS, **(defaults or {})},
                 "hosts": {name: {**HOST, **h} for name, h in hosts.items()}}
    path = root / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return str(path)


def pd_inventory(root: Path, prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
                 **kwargs: Any) -> str:
    """A prefill/decode pair and its router on one host, with role overrides merged in."""
    return write_inventory(root, {"n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]}},
                           {"prefill": {**PREFILL, **(prefill or {})}, "decode": {**DECODE, **(decode or {})},
                            "router": ROUTER}, **kwargs)


TP16 = {"engine": "sglang", "tp_size": 16, "nnodes": 2, "model": {"path": "/models/DeepSeek-V3"},
        "settings": {"trust_remote_code": True}, "health": {"timeout_s": 3600}}
EIGHT = {"numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "cpus": "0-63"}]}


def multinode(root: Path, n2_env: dict[str, str] | None = None, tp16: dict[str, Any] | None = None,
              front: dict[str, Any] | None = None) -> str:
    """TP16 over two 8-GPU nodes (deployment big) and a router on a third host, overrides merged in."""
    return write_inventory(root, {
        "n1": {**EIGHT, "address": "192.0.2.21", "roles": ["tp16"]},
        "n2": {**EIGHT, "address": "192.0.2.22", "roles": ["tp16"], **({"env": n2_env} if n2_env else {})},
        "r1": {"address": "192.0.2.23", "numa_nodes": [], "roles": ["front"]},
    }, {"tp16": {**TP16, **(tp16 or {})},
        "front": {"engine": "sglang_router", "upstreams": {"workers": ["tp16"]}, **(front or {})}}, deployment="big")


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(text: str, kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs(text) if d["kind"] == kind}


def container(lws_or_deployment: dict[str, Any], template: str = "workerTemplate") -> dict[str, Any]:
    spec = lws_or_deployment["spec"]
    pod = spec["template"] if "template" in spec else spec["leaderWorkerTemplate"][template]
    [c] = pod["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)
