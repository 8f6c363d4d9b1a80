"""A role's model against the model itself: facts that belong to another model, and a TP size the
model's attention heads do not split over.

Facts copied with a role (the README says: copy the packaged role, set ``model.path``) still
describe the copied role's model, and the memory check would size that model's weights and call
its shape "grounded". They are noticed two ways: the facts' own ``name`` that names no part of
``model.path``, and, where ``config.json`` is readable at ``model.path`` here, a shape that differs
from it. SGLang splits the attention heads evenly over the TP ranks (``QKVParallelLinear``: the
query heads divide by the TP size; the KV heads divide by it, or with more ranks than KV heads,
each is copied to ``tp / kv_heads`` ranks), so a TP size that does not fit fails at load.

Pure but for reading ``config.json`` at ``model.path`` when that is a folder here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ..errors import Problem
from ..model import Role

# model.facts key -> config.json key, for the shape both say
SHAPE = (("layers", "num_hidden_layers"), ("num_attention_heads", "num_attention_heads"),
         ("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"), ("hidden_size", "hidden_size"),
         ("vocab_size", "vocab_size"), ("intermediate_size", "intermediate_size"),
         ("moe_intermediate_size", "moe_intermediate_size"), ("num_experts_per_tok", "num_experts_per_tok"),
         ("kv_lora_rank", "kv_lora_rank"), ("qk_rope_head_dim", "qk_rope_head_dim"))


def model_problems(role: Role, *, memory: bool = True) -> list[Problem]:
    """Everything wrong between an SGLang role and its model; ``memory``: also the facts the memory
    check reads (the heads check is the engine's own, needed by every plan)."""
    if role.engine != "sglang":
        return []
    raw = role.model.get("facts")
    facts: dict[str, Any] = raw if isinstance(raw, dict) else {}
    path = role.model.get("path")
    path = path if isinstance(path, str) and path.strip() else None
    config = read_config(path)
    out: list[Problem] = []
    if memory and facts:
        out += _stale_facts(role, facts, path, config)
    heads = _heads_problem(role, facts, config)
    if heads is not None:
        out.append(Problem(heads, file=role.file, line=role.lines.get("tp_size"), role=role.name, key="tp_size"))
    return out


def read_config(path: str | None) -> dict[str, Any] | None:
    """``config.json`` of a model folder readable here (a multimodal ``text_config`` merged over the
    top, as modelfacts reads it); None when there is none or it cannot be read (the memory check then
    says why, if it needs it)."""
    if path is None:
        return None
    try:
        top = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(top, dict):
        return None
    cfg = dict(top)
    if isinstance(top.get("text_config"), dict):
        cfg.update(top["text_config"])
    cfg.setdefault("num_key_value_heads", cfg.get("num_attention_heads"))
    if not cfg.get("head_dim") and _int(cfg.get("num_attention_heads")) and _int(cfg.get("hidden_size")):
        cfg["head_dim"] = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return cfg


def names_path(name: str, path: str) -> bool:
    """Whether a model's name (``Qwen3-8B``, or a hub id ``Qwen/Qwen3-8B``) is a part of ``path``: a
    folder of it, a hub id, or a hub cache folder (``models--Qwen--Qwen3-8B/snapshots/<hash>``)."""
    want = name.strip().rstrip("/").rsplit("/", 1)[-1].lower()
    parts = {p.lower() for p in re.split(r"/|--", path) if p}
    return want in parts


def _stale_facts(role: Role, facts: dict[str, Any], path: str | None, config: dict[str, Any] | None) -> list[Problem]:
    line = role.lines.get("model.facts", role.lines.get("model"))

    def problem(message: str) -> Problem:
        return Problem(message, file=role.file, line=line, role=role.name, key="model.facts")

    out: list[Problem] = []
    name = facts.get("name")
    if isinstance(name, str) and name.strip() and path is not None and not names_path(name, path):
        out.append(problem(
            f"model.facts are {name}'s (their name), but model.path is {path}: the memory check would size "
            f"{name}'s weights and shape. Give this model's facts, or remove model.facts where config.json and the "
            f"safetensors index are readable at model.path here; if these facts are this model's, set their name "
            f"to {Path(path).name}"))
    if config is not None:
        differ = [f"{key} {facts[key]} vs {ckey} {config[ckey]}" for key, ckey in SHAPE
                  if _int(facts.get(key)) is not None and _int(config.get(ckey)) is not None
                  and _int(facts.get(key)) != _int(config.get(ckey))]
        if differ:
            out.append(problem(
                f"model.facts do not match {Path(str(path)) / 'config.json'}: {', '.join(differ)}; they describe "
                "another model: remove model.facts (config.json and the safetensors index at model.path are read "
                "instead where they are readable) or correct them"))
    return out


def _heads_problem(role: Role, facts: dict[str, Any], config: dict[str, Any] | None) -> str | None:
    """The TP size against the model's attention heads, from config.json when readable, else the facts."""
    if config is not None:
        heads, kv = _int(config.get("num_attention_heads")), _int(config.get("num_key_value_heads"))
        mla = bool(config.get("kv_lora_rank"))
        source = f"config.json at {role.model.get('path')}"
    else:
        heads, kv = _int(facts.get("num_attention_heads")), _int(facts.get("kv_heads"))
        mla = str(facts.get("kind", "mha")).lower() == "mla"
        source = "model.facts"
    tp, what = _attention_tp(role)
    if tp is None:
        return None
    if heads and heads % tp:
        return (f"{what} does not divide the model's {heads} attention heads ({source}): SGLang splits them "
                f"evenly over the TP ranks; use one of {_divisors(heads)}")
    if mla or not kv:
        return None  # MLA's latent KV is not split by head
    if tp <= kv and kv % tp:
        return (f"{what} does not divide the model's {kv} KV heads ({source}): SGLang splits them evenly over "
                f"the TP ranks; use one of {_divisors(kv)} or a multiple of {kv}")
    if tp > kv and tp % kv:
        return (f"{what} is more than the model's {kv} KV heads ({source}) but not a multiple of {kv}: SGLang "
                f"copies each KV head to a whole number of ranks; use a multiple of {kv} or one of {_divisors(kv)}")
    return None


def _attention_tp(role: Role) -> tuple[int | None, str]:
    """The ranks the attention heads split over: tp_size, or with DP attention tp_size / dp_size."""
    tp = role.tp_size
    dp = _int(role.settings.get("dp_size")) or 1
    if role.settings.get("enable_dp_attention") is True and dp > 1:
        if tp % dp:
            return None, ""  # SGLang refuses that itself, and says so
        return tp // dp, f"tp_size {tp} / dp_size {dp} (attention TP {tp // dp} with DP attention)"
    return tp, f"tp_size {tp}"


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _int(value: Any) -> int | None:
    """A whole number from YAML or JSON (94 or 94.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) else None
