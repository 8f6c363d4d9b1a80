"""Issue 47's benchmark: the search (gpudeploy tune) against the exhaustive grid, on a documented
response surface.

    .venv/bin/python bench/tune.py [--seeds 5] [--out bench/results/tune.md]

No hosts: fakelab (tests/experiment/fakelab.py) stands in for deploy, status and the benchmark client,
and tests/experiment/surface.py makes it answer to the decode server's settings (its docstring is the
surface: a throughput optimum inside the space, an SLO that cuts the large batches, a region the
memory preflight refuses, and one where only a launch shows the OOM). Everything else is gpudeploy's
own: the planner and the real memory preflight, the runner, the store, Optuna's samplers in SQLite.

Printed: the grid's launches and its best feasible score (run through `experiment`, not computed),
then per seed the launches the search needed to come within 5% of that score, the launches of
variants the memory preflight refuses (target 0), the launches inside a region an earlier OOM launch
showed (target 0), and the median over the seeds against the target: a third of the grid's launches.
A benchmark that prints figures: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests" / "experiment")]

import pytest  # noqa: E402  (MonkeyPatch: fakelab patches the runner's host access)
import surface  # noqa: E402
from fakelab import FakeLab  # noqa: E402

from gpudeploy.experiment import runner  # noqa: E402
from gpudeploy.experiment.search import run_search  # noqa: E402
from gpudeploy.experiment.spec import load_experiment  # noqa: E402
from gpudeploy.experiment.variants import plan_variants  # noqa: E402

WITHIN = 0.95


def quiet(line: str) -> None:
    return None


def grid(folder: Path) -> dict[str, Any]:
    """The exhaustive grid through `experiment` on fakelab: its launches and its best feasible score."""
    with pytest.MonkeyPatch.context() as mp:
        lab = surface.answer(FakeLab(mp))
        path = surface.write(folder, surface.GRID + surface.BENCH)
        exp = load_experiment(path)
        refused = {surface.decode(p.plan) for p in plan_variants(exp) if not p.boots}
        started = time.monotonic()
        store = runner.run_experiment(exp, say=quiet)
        took = time.monotonic() - started
        scores = [runner._variant_score(store, v["key"], exp) for v in store.current() if v["status"] == "measured"]
        launched = surface.launched(lab)
    best = max(s for s in scores if s is not None)
    return {"points": len(exp.variants), "launches": len(launched), "refused": refused, "best": best,
            "oom": sum(1 for m, b, _ in launched if surface.launch_ooms(m, b)), "took_s": took}


def search(folder: Path, seed: int, launches: int, best: float, refused: set[tuple[float, int, int]]) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        lab = surface.answer(FakeLab(mp))
        path = surface.write(folder, surface.search_file(launches=launches, seed=seed))
        started = time.monotonic()
        result = run_search(load_experiment(path), say=quiet)
        took = time.monotonic() - started
        launched = surface.launched(lab)
    assert result is not None
    reached = None
    top = 0.0
    for i, point in enumerate(launched, 1):
        top = max(top, surface.score(*point) or 0.0)
        if reached is None and top >= WITHIN * best:
            reached = i
    # a launch inside the region of an earlier OOM launch: m, b and r each at least the OOM's
    ooms: list[tuple[float, int, int]] = []
    again = 0
    for m, b, r in launched:
        if any(m >= m0 and b >= b0 and r >= r0 for m0, b0, r0 in ooms):
            again += 1
        if surface.launch_ooms(m, b):
            ooms.append((m, b, r))
    return {"seed": seed, "reached": reached, "best": top, "launches": len(launched),
            "refused_launched": sum(1 for p in launched if p in refused), "oom": len(ooms), "again": again,
            "tally": result.tally, "took_s": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures (markdown) here")
    args = ap.parse_args()
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None  # the study's SQLite commits: no disk sync
    tmp = Path(tempfile.mkdtemp(prefix="gpudeploy-bench-tune-", dir=base))
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        g = grid(tmp / "grid")
        budget = g["launches"] // 3
        at = surface.grid_best()
        say("# gpudeploy tune against the exhaustive grid (bench/tune.py)")
        say()
        say("Response surface: tests/experiment/surface.py (decode mem_fraction_static x cuda_graph_max_bs x "
            "max_running_requests on inventory/hosts.yml, SLO p99 TPOT <= 40 ms, ladder [16, 64, 256] bisected).")
        say()
        say(f"- grid: {g['points']} points, {len(g['refused'])} refused by the memory preflight (no launch), "
            f"**{g['launches']} launches** ({g['oom']} of them OOM at launch), {g['took_s']:.0f} s on fakelab")
        say(f"- grid's best feasible score: **{g['best']:.1f} output tok/s per GPU** (the surface says {at[0]:.1f} "
            f"at m={at[1][0]}, b={at[1][1]}, r={at[1][2]}); within 5%: >= {WITHIN * g['best']:.1f}")
        say(f"- search budget: {budget} launches (a third of the grid's); TPE with constraints, default settings, "
            "the inventory's own values first")
        say()
        say("| seed | launches to within 5% | best found | launches | OOM launches | launches inside an earlier "
            "OOM's region | launches of preflight-refused variants | refused without launch (preflight / learned) "
            "| trials | wall |")
        say("|---|---|---|---|---|---|---|---|---|---|")
        runs = []
        for seed in range(1, args.seeds + 1):
            r = search(tmp / f"seed{seed}", seed, budget, g["best"], g["refused"])
            runs.append(r)
            t = r["tally"]
            say(f"| {seed} | {r['reached'] if r['reached'] is not None else 'not reached'} | {r['best']:.1f} | "
                f"{r['launches']} | {r['oom']} | {r['again']} | {r['refused_launched']} | "
                f"{t.refused_preflight} / {t.refused_learned} | {t.trials} | {r['took_s']:.0f} s |")
        needed = [r["reached"] if r["reached"] is not None else budget + 1 for r in runs]
        median = statistics.median(needed)
        say()
        say(f"- median launches to within 5%: **{median:g}** (target: <= {g['launches'] / 3:.0f}, a third of the "
            f"grid's {g['launches']}): {'MET' if median <= g['launches'] / 3 else 'NOT MET'}")
        say(f"- launches of variants the memory preflight refuses: **{sum(r['refused_launched'] for r in runs)}** "
            "(target 0)")
        say(f"- launches inside the region of an earlier OOM launch: **{sum(r['again'] for r in runs)}** (target 0; "
            "a region: every searched key of the role at least as large as at the OOM)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
