"""Issue 23's benchmark: a rolling update of a serving PD deployment under load, against a plain restart.

    .venv/bin/python bench/rolling.py [--rounds 1] [--clients 2] [--out bench/results]

On the lab (brought up if it is not, taken down again then), with the real SGLang 0.5.23 PD pair
(CPU build, the tiny model) and the real sglang-router: lab/inventory/lab-sglang.yml (prefill lab1,
decode lab2, router lab3). Per round: deploy the pair, start a bounded load (``gpudeploy_lab.load``:
N clients sending /generate through the router, one request after another, every request kept with
its start, end and status), change both engines' env, and deploy again:

  rolling   ``invoke deploy`` (a serving deployment rolls through its router);
  restart   ``invoke deploy --no-rolling`` (the engines restart; the router restarts after them).

Printed per mode: requests and failed requests before, during and after the update window (the
deploy command's run), p50/p99 latency of each, and the update's total time. A benchmark that prints
figures, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import gpudeploy_lab as labctl  # noqa: E402
from gpudeploy_lab import engine  # noqa: E402
from gpudeploy_lab.load import Load, Sent, percentile  # noqa: E402

PAIR = REPO / "lab" / "inventory" / "lab-sglang.yml"
ROUTER = "http://10.231.0.13:8000/generate"


def invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def inventory(root: Path, marker: str) -> Path:
    inv = yaml.safe_load(PAIR.read_text())
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name in ("sglang-cpu-prefill", "sglang-cpu-decode", "sglang-cpu-router"):
        role = yaml.safe_load((REPO / "lab" / "roles" / f"{name}.yml").read_text())
        if name != "sglang-cpu-router":
            role["env"]["GPUDEPLOY_BENCH_VERSION"] = marker
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role, sort_keys=False))
    inv.update(roles_dir=str(root / "roles"))
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def figures(sent: list[Sent]) -> dict[str, Any]:
    ok = [s.latency_s * 1000 for s in sent if s.ok]
    return {"requests": len(sent), "failed": sum(1 for s in sent if not s.ok),
            "p50_ms": percentile(ok, 50), "p99_ms": percentile(ok, 99),
            "errors": sorted({f"{s.status} {s.error[:80]}" for s in sent if not s.ok})[:5]}


def one(mode: str, clients: int, root: Path) -> dict[str, Any]:
    first = inventory(root / f"{mode}-a", "1")
    res = invoke("deploy", "--inventory", str(first))
    if res.returncode != 0:
        raise SystemExit(f"the first deploy failed:\n{res.stdout[-3000:]}{res.stderr[-2000:]}")
    second = inventory(root / f"{mode}-b", "2")
    with Load(ROUTER, clients=clients) as load:
        wait = time.monotonic() + 10  # some requests before the update
        while time.monotonic() < wait:
            time.sleep(0.2)
        start = time.monotonic()
        res = invoke("deploy", "--inventory", str(second), *(["--no-rolling"] if mode == "restart" else []))
        end = time.monotonic()
        wait = time.monotonic() + 10  # and some after it
        while time.monotonic() < wait:
            time.sleep(0.2)
    before, during, after = load.window(start, end)
    out = {"mode": mode, "deploy_rc": res.returncode, "update_s": round(end - start, 1),
           "before": figures(before), "during": figures(during), "after": figures(after)}
    if res.returncode != 0:
        out["deploy_tail"] = (res.stdout + res.stderr)[-1500:]
    invoke("teardown", "--inventory", str(first), "--purge")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    engine.ensure_all()
    brought = not [s for s in labctl.status() if s.up]
    if brought:
        labctl.up(3)
    results = []
    try:
        for r in range(args.rounds):
            for mode in ("rolling", "restart"):
                got = one(mode, args.clients, Path(f"/tmp/gpudeploy-bench-rolling/{r}"))
                results.append(got)
                print(json.dumps(got), flush=True)
    finally:
        if brought:
            labctl.down()
    stamp = time.strftime("%Y-%m-%d")
    path = Path(args.out) / f"rolling-{stamp}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{'mode':8} {'update s':>8}  {'before req/failed p50/p99 ms':30} {'during':30} {'after':30}")
    for r in results:
        cells = [f"{r[w]['requests']}/{r[w]['failed']} {fmt(r[w]['p50_ms'])}/{fmt(r[w]['p99_ms'])}"
                 for w in ("before", "during", "after")]
        print(f"{r['mode']:8} {r['update_s']:>8}  {cells[0]:30} {cells[1]:30} {cells[2]:30}")
    print(f"results: {path}")
    return 0


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
