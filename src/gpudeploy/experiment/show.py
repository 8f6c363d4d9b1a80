"""`invoke experiment show [--json]`: variant x concurrency, from the store. Pure (reads local files)."""

from __future__ import annotations

from typing import Any

from . import choose
from .store import Store

SYNTHETIC = ("synthetic: the lab's SGLang stand-in engines send tokens on a made-up schedule, so their "
             "TTFT/TPOT/tok/s measure gpudeploy's path and the router, not an engine")


def timing(variant: dict[str, Any]) -> str:
    """How far the token timing is the hardware's: the stand-in's schedule, a CPU engine's, a GPU's."""
    if variant["synthetic"]:
        return "synthetic"
    return "measured (CPU)" if variant.get("gpus") == 0 else "measured"


def summary(store: Store) -> dict[str, Any]:
    """The whole result as one document: what `show --json` prints and the table and plot are made of."""
    meta = store.meta()
    slo: dict[str, float] = meta.get("slo") or {}
    runs = store.runs()
    variants = []
    current = store.current()
    keys = {v["key"] for v in current}
    names = {v["name"] for v in current}
    stale = [v["name"] + (" (its earlier definition)" if v["name"] in names else "")
             for v in store.variants() if v["key"] not in keys]
    for v in current:
        mine = [r for r in runs if r.variant_key == v["key"]]
        by: dict[int, list[Any]] = {}
        for r in mine:
            by.setdefault(r.concurrency, []).append(r)
        levels = []
        for c in sorted(by):
            ok = [r for r in by[c] if r.ok]
            fig = choose.aggregate([r.figures for r in ok]) if ok else {}
            miss = choose.misses(fig, slo) if ok else ["no result"]
            levels.append({"concurrency": c, "repeats": len(ok), "figures": fig,
                           "meets_slo": (not miss) if slo else None, "misses": miss if slo else [],
                           "failed_under_load": next((r.failed_under_load for r in by[c] if r.failed_under_load), None),
                           "raw_files": [r.raw_file for r in by[c] if r.raw_file],
                           "client_argv": by[c][0].argv, "wall_s": round(sum(r.wall_s for r in by[c]), 1)})
        measured = {lv["concurrency"]: lv["figures"] for lv in levels if lv["repeats"]}
        best_c = choose.best_level(measured, slo) if v["status"] == "measured" else None
        variants.append({
            "name": v["name"], "key": v["key"], "status": v["status"], "grid": v["grid"], "overrides": v["overrides"],
            "verdict": v["verdict"], "failure": v["failure"],
            "saved_min": round(v["saved_s"] / 60, 3) if v.get("saved_s") else None,
            "engine": v["engine"], "engine_release": v["engine_release"], "client": v["client"],
            "synthetic": v["synthetic"], "timing": timing(v),
            "gpus": v["gpus"], "deploy_s": round(v["deploy_s"], 1) if v.get("deploy_s") else None,
            "memory": v["memory"], "units": v["units"],
            "best_concurrency": best_c,
            "score_tok_s_per_gpu": choose.score(measured, slo) if v["status"] == "measured" else None,
            "levels": levels})
    scored = [v for v in variants if v["score_tok_s_per_gpu"] is not None]
    best = max(scored, key=lambda v: v["score_tok_s_per_gpu"]) if scored else None
    search = meta.get("search")
    if search:
        best = _best_first(variants, slo, search)
    saved = sum(v["saved_min"] or 0 for v in variants)
    return {"experiment": meta.get("name"), "file": meta.get("file"), "inventory": meta.get("inventory"),
            "benchmark": meta.get("benchmark"), "slo": slo, "store": str(store.path),
            "search": search,  # a tune's: its study and objectives; its variants are listed best first
            "best": {"variant": best["name"], "concurrency": best["best_concurrency"],
                     "output_tok_s_per_gpu": best["score_tok_s_per_gpu"], "timing": best["timing"],
                     **({"objectives": best["objectives"]} if search else {})} if best else None,
            "minutes_saved_by_preflight": round(saved, 3),  # as each variant's saved_min
            "synthetic_note": SYNTHETIC if any(v["synthetic"] for v in variants) else None,
            "stale": stale,  # stored variants the experiment file (as it last ran) no longer defines
            "variants": variants}


def _best_first(variants: list[dict[str, Any]], slo: dict[str, float], search: dict[str, Any]) -> dict[str, Any] | None:
    """A search's variants, best first by its first objective (feasible ones first: met the SLO, every
    figure there), each with its objective values; the best, or None."""
    from .objective import evaluate
    from .search_space import Objective

    objectives = [Objective(o["name"], o["direction"], o.get("concurrency")) for o in search["objectives"]]
    for v in variants:
        levels = {lv["concurrency"]: lv["figures"] for lv in v["levels"] if lv["repeats"]}
        ev = evaluate(levels, slo, objectives) if v["status"] == "measured" else None
        v["objectives"] = {o.label: val for o, val in zip(objectives, ev.values, strict=True)} if ev else None
        v["feasible"] = bool(ev and ev.feasible)
        if ev and ev.feasible and objectives[0].concurrency is not None:
            v["best_concurrency"] = objectives[0].concurrency

    def rank(v: dict[str, Any]) -> tuple[int, float]:
        first = (v["objectives"] or {}).get(objectives[0].label)
        if not v["feasible"] or first is None:
            return (1, 0.0)
        return (0, -first if objectives[0].direction == "maximize" else first)

    variants.sort(key=rank)
    return variants[0] if variants and variants[0]["feasible"] else None


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _ms(fig: dict[str, Any], stat: str, metric: str) -> str:
    v = fig.get(f"{stat}_{metric}_ms")
    return "-" if v is None else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _num(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(doc: dict[str, Any]) -> str:
    head = ("", "VARIANT", "C", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "OUT tok/s", "/GPU", "/USER", "W", "/W",
            "ACCEPT", "FAILED", "SLO", "TIMING")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    best = doc.get("best") or {}
    for v in doc["variants"]:
        if v["status"] != "measured" and not v["levels"]:
            what = v["verdict"] if v["status"] == "skipped" else v["failure"] or v["status"]
            rows.append(("", v["name"], "-", "", "", "", "", "", "", "", "", "", "", v["status"]))
            notes.append(f"{v['name']}: {v['status'].upper()}: {what}"
                         + (f" (saved {_duration(v['saved_min'] * 60)})" if v.get("saved_min") else ""))
            continue
        for lv in v["levels"]:
            f = lv["figures"]
            mark = "*" if v["name"] == best.get("variant") and lv["concurrency"] == best.get("concurrency") else ""
            slo = "" if lv["meets_slo"] is None else "met" if lv["meets_slo"] else "MISSED"
            if lv["failed_under_load"]:
                slo = "DIED"
            rows.append((mark, v["name"], str(lv["concurrency"]),
                         f"{_ms(f, 'median', 'ttft')}/{_ms(f, 'p99', 'ttft')}",
                         f"{_ms(f, 'median', 'tpot')}/{_ms(f, 'p99', 'tpot')}",
                         _num(f.get("output_tok_s")), _num(f.get("output_tok_s_per_gpu")),
                         _num(f.get("output_tok_s_per_user")), _num(f.get("mean_power_w"), 0),
                         _num(f.get("output_tok_s_per_w"), 2), _num(f.get("accept_length"), 2),
                         str(f.get("failed", "-")) if f else "-", slo, v["timing"]))
        if v["status"] != "measured":
            notes.append(f"{v['name']}: {v['status'].upper()}: {v['failure'] or v['verdict'] or ''}")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    bounds = ", ".join(f"{k} <= {b:g}" for k, b in doc["slo"].items())
    lines = [f"experiment {doc['experiment']}" + (f"  (SLO: {bounds})" if bounds else "  (no SLO)")]
    releases = sorted({v["engine_release"] for v in doc["variants"] if v["engine_release"]})
    clients = sorted({v["client"] for v in doc["variants"] if v["client"]})
    if releases or clients:
        lines.append(f"engine {', '.join(releases) or '?'}; client: {', '.join(clients) or '?'}'s own benchmark, "
                     "through the router")
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    if best and doc.get("search"):
        figures = ", ".join(f"{k} {v:.1f}" for k, v in best["objectives"].items() if v is not None)
        lines.append(f"* best by the search's objective{'s' if len(best['objectives']) > 1 else ''}"
                     f"{' under the SLO' if doc['slo'] else ''}: {best['variant']}"
                     + (f" at concurrency {best['concurrency']}" if best["concurrency"] else "")
                     + f": {figures} ({best['timing']} timing); variants best first")
    elif best:
        lines.append(f"* best under the SLO: {best['variant']} at concurrency {best['concurrency']}: "
                     f"{best['output_tok_s_per_gpu']:.1f} output tok/s per GPU ({best['timing']} timing)")
    else:
        lines.append("no variant met the SLO" if doc["slo"] else "nothing measured yet")
    lines += notes
    if doc["minutes_saved_by_preflight"]:
        lines.append(f"the memory preflight saved {_duration(doc['minutes_saved_by_preflight'] * 60)} of deploys "
                     "that would not have booted")
    if doc.get("stale"):
        lines.append(f"not shown: stored variants whose definition the experiment file no longer has: "
                     f"{', '.join(doc['stale'])}")
    if doc.get("synthetic_note"):
        lines.append(f"timing {doc['synthetic_note']}")
    if any(lv["figures"].get("power_standin") for v in doc["variants"] for lv in v["levels"]):
        lines.append("power from a stand-in NVML (the lab's): modelled from its processes' CPU time, not measured")
    lines.append("/GPU: output tok/s per GPU (per engine for a CPU engine); /USER: a request's output tokens / its "
                 "median end-to-end latency, the rate one user's answer completes at; W: the mean draw of the "
                 "engines' GPUs together while the client measured (NVML, '-' without GPUs or NVML); /W: output "
                 "tok/s per watt")
    return "\n".join(lines)
