"""Prefill/decode compatibility, at plan time: what makes a PD pair hang or fail its first request.

For every router that fronts prefill and decode upstreams, each prefill/decode pair of its
deployment must serve the same model (path and revision), move KV with the same transfer backend,
name InfiniBand devices on both sides or on neither, and, for a non-MLA model whose two sides use
different TP sizes, set ``SGLANG_DISAGG_STAGING_BUFFER=1`` (else requests hang:
shared/reference/sglang.md). Pure: reads the planned units only.
"""

from __future__ import annotations

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
        prefills = [u for u in mine if u.role.name in ups["prefill"]]
        decodes = [u for u in mine if u.role.name in ups["decode"]]
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
    out: list[Problem] = []
    pair = f"prefill {p.key} and decode {d.key}"
    for key in ("path", "revision"):
        a, b = p.role.model.get(key), d.role.model.get(key)
        if a != b:
            out.append(_at(d, f"model.{key}", f"{pair} serve different models: model.{key} {a!r} vs {b!r}; "
                                               "the decode server would receive KV of another model"))
    pb = p.role.settings.get("disaggregation_transfer_backend", DEFAULT_BACKEND)
    db = d.role.settings.get("disaggregation_transfer_backend", DEFAULT_BACKEND)
    if pb != db:
        out.append(_at(d, "settings.disaggregation_transfer_backend",
                       f"{pair} use different KV transfer backends ({pb} vs {db}); set the same on both"))
    pi, di = p.role.settings.get("disaggregation_ib_device"), d.role.settings.get("disaggregation_ib_device")
    if (pi is None) != (di is None):
        side = d if di is None else p
        out.append(_at(side, "settings.disaggregation_ib_device",
                       f"{pair}: only one side names InfiniBand devices ({pi!r} vs {di!r}); name them on both "
                       "(the KV transfer would fall back to another NIC on one side) or on neither"))
    kind = _model_kind(p) or _model_kind(d)
    staged = all(u.env.get("SGLANG_DISAGG_STAGING_BUFFER") == "1" for u in (p, d))
    if p.role.tp_size != d.role.tp_size and kind not in (None, "mla") and not staged:
        out.append(_at(d, "env.SGLANG_DISAGG_STAGING_BUFFER",
                       f"{pair} use different TP sizes ({p.role.tp_size} vs {d.role.tp_size}) with a non-MLA "
                       f"model ({kind}): requests hang unless both set SGLANG_DISAGG_STAGING_BUFFER=1 in env"))
    return out


def _model_kind(u: Unit) -> str | None:
    facts = u.role.model.get("facts")
    kind = facts.get("kind") if isinstance(facts, dict) else None
    return str(kind) if kind else None


def _at(u: Unit, key: str, message: str) -> Problem:
    top = key.split(".")[0]
    return Problem(message, file=u.role.file, line=u.role.lines.get(key, u.role.lines.get(top)),
                   host=u.host.name, role=u.role.name, key=key)
