"""The memory preflight's validation table: every case of tests/memory/cases.yaml, as a user meets it.

    .venv/bin/python bench/memory_table.py [--cases tests/memory/cases.yaml] [--markdown]

Per case: what the source reports (boots or fails), the verdict and severity the preflight gives the
settings as launched, whether that is right (a failing case must be flagged, warn or refuse; a
booting case must never be refused), and the KV tokens against the logged figure where the log
gives one. It runs against whichever gpudeploy is on the path, also one from before the memory
model moved to ``gpudeploy.memory`` (its cases' new keys are dropped there), so the same table can
be printed before and after a change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CASES = HERE.parent / "tests" / "memory" / "cases.yaml"


def _api() -> dict[str, Any]:
    try:
        from gpudeploy.memory import modelfacts, recommend, releases
        from gpudeploy.memory.settings import EngineSettings
    except ImportError:  # before the memory model was its own package
        from gpudeploy.plan.engine_settings import EngineSettings  # type: ignore[no-redef]

        from gpudeploy.plan import memory as recommend  # type: ignore[no-redef]
        from gpudeploy.plan import modelfacts  # type: ignore[no-redef]
        from gpudeploy.plan import sglang_release as releases
    try:
        from gpudeploy.memory.logparse import Measured
    except ImportError:  # before the memory model was its own package
        from gpudeploy.plan.calibrate import Measured  # type: ignore[no-redef]
    return {"budget": recommend.budget, "settings": EngineSettings, "from_dir": modelfacts.model_facts_from_dir,
            "measured": Measured,
            "from_mapping": modelfacts.model_facts_from_mapping, "mapping_keys": modelfacts._MAPPING_KEYS,
            "release": releases.release_rules}


def model_of(api: dict[str, Any], table: dict[str, Any], spec: Any, fixtures: Path) -> Any:
    if isinstance(spec, dict) and "fixture" in spec:
        return api["from_dir"](fixtures / spec["fixture"])
    facts = {k: v for k, v in table["models"][spec].items() if k in api["mapping_keys"]}
    return api["from_mapping"](facts, where=f"cases.yaml:models.{spec}")


def row(api: dict[str, Any], table: dict[str, Any], case: dict[str, Any], fixtures: Path) -> dict[str, Any]:
    try:
        model = model_of(api, table, case["model"], fixtures)
        s = api["settings"].from_settings(case["settings"], tp_size=case["settings"].get("tp_size", 1))
        # what the log itself said before the pools (Load weight begin/end), as NVML and the index would
        logged = api["measured"](**case["logged"]) if case.get("logged") else None
        b = api["budget"](case["capacity"], model, s, logged, release=case["release"])
    except Exception as exc:
        return {"id": case["id"], "boots": case["boots"], "verdict": f"error: {exc}"[:60], "severity": "-",
                "right": False, "kv_err": None, "confident": False, "source": case.get("source", "")}
    flagged = b.severity in ("warn", "refuse")
    right = (b.severity != "refuse") if case["boots"] else flagged
    # sure and right: a booting case called fits/ok, a failing one refused
    confident = (b.verdict == "fits" and b.severity == "ok") if case["boots"] else b.severity == "refuse"
    kv_err = None
    if case.get("reported_tokens"):
        kv_err = (b.kv_tokens - case["reported_tokens"]) / case["reported_tokens"]
    spec = case["model"]
    guessed = [] if isinstance(spec, dict) else list(table["models"][spec].get("assumed") or [])
    return {"id": case["id"], "boots": case["boots"], "verdict": b.verdict, "severity": b.severity,
            "right": right, "kv_err": kv_err, "kv": b.kv_tokens, "reported": case.get("reported_tokens"),
            "guessed": guessed, "confident": confident, "source": case.get("source", "")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    path = Path(args.cases)
    table = yaml.safe_load(path.read_text())
    api = _api()
    rows = [row(api, table, c, path.parent / "fixtures") for c in table["cases"]]
    if args.markdown:
        print("| case | source reports | verdict | severity | right | KV tokens error |")
        print("|---|---|---|---|---|---|")
    for r in rows:
        kv = "-" if r["kv_err"] is None else f"{r['kv_err'] * 100:+.1f}%"
        if r["kv_err"] is not None and r.get("guessed"):
            kv += f" ({', '.join(r['guessed'])} assumed)"
        outcome = "boots" if r["boots"] else "fails"
        ok = "yes" if r["right"] else "NO"
        if args.markdown:
            print(f"| {r['id']} | {outcome} | {r['verdict']} | {r['severity']} | {ok} | {kv} |")
        else:
            print(f"{r['id']:48} {outcome:6} {r['verdict']:28} {r['severity']:7} {ok:4} {kv}")
    failing = [r for r in rows if not r["boots"]]
    booting = [r for r in rows if r["boots"]]
    kv = [r for r in rows if r["kv_err"] is not None]
    logged = [r for r in kv if not r.get("guessed")]
    print(f"\nfailing cases flagged: {sum(r['right'] for r in failing)} of {len(failing)}; "
          f"booting cases not refused: {sum(r['right'] for r in booting)} of {len(booting)}; "
          f"KV tokens within 5%: {sum(abs(r['kv_err']) <= 0.05 for r in kv)} of {len(kv)} "
          f"({sum(abs(r['kv_err']) <= 0.05 for r in logged)} of {len(logged)} where the log gives every input)")
    print(summary(rows))
    print(releases_line(api, path.parent / "fixtures"))
    return 0


# every release on PyPI from 0.4.4 to 0.5.23 (tests/plan/test_offline_releases.py plans each offline)
RELEASES = (["0.4.4", "0.4.5", "0.4.6", "0.4.7", "0.4.8", "0.4.9", "0.4.10", "0.5.1", "0.5.2", "0.5.3"]
            + [f"0.5.{n}" for n in range(4, 24)])


def releases_line(api: dict[str, Any], fixtures: Path) -> str:
    """Issue 44's last target: each release's rules give a verdict (Llama 3.1 70B at TP4 on 80 GB, defaults)."""
    model = api["from_dir"](fixtures / "llama-3.1-70b")
    s = api["settings"].from_settings({}, tp_size=4)
    planned, read = 0, 0
    for release in RELEASES:
        try:
            b = api["budget"](79.19, model, s, release=release)
        except Exception as exc:  # a release the rules cannot plan: counted as not planned, and said
            print(f"release {release}: {exc}", file=sys.stderr)
            continue
        planned += b.severity != "refuse"
        read += bool(getattr(api["release"](release), "checked", True))
    return (f"releases {RELEASES[0]} - {RELEASES[-1]} planned offline: {planned} of {len(RELEASES)} "
            f"({read} with rules read from their own wheel, the rest the nearest read one's, banded)")


def summary(rows: list[dict[str, Any]]) -> str:
    """The issue 44 figures: what a user meets, in one line each."""
    booting = [r for r in rows if r["boots"]]
    failing = [r for r in rows if not r["boots"]]
    kv = [r for r in rows if r["kv_err"] is not None]
    sourced = sum(1 for r in rows if r.get("source"))
    return "\n".join([
        f"cases: {len(rows)} ({len(booting)} boot, {len(failing)} fail; {sourced} name their source)",
        f"booting refused: {sum(r['severity'] == 'refuse' for r in booting)}",
        f"failing called fits/ok: {sum(r['verdict'] == 'fits' and r['severity'] == 'ok' for r in failing)}",
        f"confident and right: {sum(r['confident'] for r in rows)} of {len(rows)}",
        f"hedged (warn): {sum(r['severity'] == 'warn' for r in rows)} of {len(rows)}",
        f"KV tokens within 10%: {sum(abs(r['kv_err']) <= 0.10 for r in kv)} of {len(kv)} that logged them",
    ])


if __name__ == "__main__":
    sys.exit(main())
