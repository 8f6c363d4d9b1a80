"""Prefill/decode compatibility, at plan time: what makes a PD pair hang or fail its first request.

For every router that fronts prefill and decode upstreams, each prefill/decode pair of its
deployment must serve the same model (path and revision), move KV with the same transfer backend,
name InfiniBand devices on both sides or on neither, and, for a non-MLA model whose two sides use
different TP sizes, set ``SGLANG_DISAGG_STAGING_BUFFER=1`` (else requests hang:
shared/reference/sglang.md). Pure: reads the planned units only.
"""

from __future__ import annotations

from typing import Any

from ..errors import Problem
from ..model import Unit

DEFAULT_BACKEND = "mooncake"  # SGLang's --disaggregation-transfer-backend default


def pd_problems(units: list[Unit]) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for router in units:
        ups = router.role.upstreams
        if router.role.engine != "sglang_router" or not (ups.get("prefill") and ups.get("decode")):
            continue
        mine = [u for u in units if u.deployment == router.deployment]
        prefills = [u for u in mine if u.role.named_in(ups["prefill"])]
        decodes = [u for u in mine if u.role.named_in(ups["decode"])]
        for u, mode in [(p, "prefill") for p in prefills] + [(d, "decode") for d in decodes]:
            got = u.role.settings.get("disaggregation_mode")
            if got != mode and (u.key, "mode") not in seen:
                seen.add((u.key, "mode"))
                problems.append(_at(u, "settings.disaggregation_mode",
                                    f"router {router.role.name} uses this role as a {mode} server, but its "
                                    f"disaggregation_mode is {got!r}; set disaggregation_mode: {mode}"))
        for p in prefills:
            for d in decodes:
                if (p.key, d.key) not in seen:
                    seen.add((p.key, d.key))
                    problems += pair_problems(p, d)
    return problems


def pair_problems(p: Unit, d: Unit) -> list[Problem]:
    pair = f"prefill {p.key} and decode {d.key}"
    return [_at(d if side == "decode" else p, key, pair + what)
            for key, side, what in mismatches(pair_facts(p), pair_facts(d))]


def pair_facts(u: Unit) -> dict[str, Any]:
    """What decides whether an engine can pair with the other side: the model, the KV transfer, the
    TP size. Also kept in each run's record on the host (apply/deploy.py), so that a rolling update
    can check a new engine against the other side as it runs now (apply/pair_roll.py)."""
    return {"path": u.role.model.get("path"), "revision": u.role.model.get("revision"),
            "backend": u.role.settings.get("disaggregation_transfer_backend", DEFAULT_BACKEND),
            "ib_device": u.role.settings.get("disaggregation_ib_device"), "tp_size": u.role.tp_size,
            "staging": u.env.get("SGLANG_DISAGG_STAGING_BUFFER") == "1", "kind": _model_kind(u)}


def mismatches(p: dict[str, Any], d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Why a prefill and a decode with these :func:`pair_facts` cannot pair: (key, the side to edit,
    "prefill" or "decode", the words that follow the pair's name)."""
    out: list[tuple[str, str, str]] = []
    for key in ("path", "revision"):
        a, b = p.get(key), d.get(key)
        if a != b:
            out.append((f"model.{key}", "decode", f" serve different models: model.{key} {a!r} vs {b!r}; the decode "
                                                  "server would receive KV of another model"))
    if p.get("backend") != d.get("backend"):
        out.append(("settings.disaggregation_transfer_backend", "decode",
                    f" use different KV transfer backends ({p.get('backend')} vs {d.get('backend')}); "
                    "set the same on both"))
    pi, di = p.get("ib_device"), d.get("ib_device")
    if (pi is None) != (di is None):
        out.append(("settings.disaggregation_ib_device", "decode" if di is None else "prefill",
                    f": only one side names InfiniBand devices ({pi!r} vs {di!r}); name them on both "
                    "(the KV transfer would fall back to another NIC on one side) or on neither"))
    kind = p.get("kind") or d.get("kind")
    staged = bool(p.get("staging") and d.get("staging"))
    if p.get("tp_size") != d.get("tp_size") and kind not in (None, "mla") and not staged:
        out.append(("env.SGLANG_DISAGG_STAGING_BUFFER", "decode",
                    f" use different TP sizes ({p.get('tp_size')} vs {d.get('tp_size')}) with a non-MLA model "
                    f"({kind}): requests hang unless both set SGLANG_DISAGG_STAGING_BUFFER=1 in env"))
    return out


def _model_kind(u: Unit) -> str | None:
    facts = u.role.model.get("facts")
    kind = facts.get("kind") if isinstance(facts, dict) else None
    return str(kind) if kind else None


def _at(u: Unit, key: str, message: str) -> Problem:
    top = key.split(".")[0]
    return Problem(message, file=u.role.file, line=u.role.lines.get(key, u.role.lines.get(top)),
                   host=u.host.name, role=u.role.name, key=key)
