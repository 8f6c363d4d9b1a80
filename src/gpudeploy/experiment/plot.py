"""The experiment's plot (PNG): output tok/s per GPU against tok/s per user, one line per variant
(its concurrency levels, labelled), the Pareto front over every point highlighted.

Up and to the right is better: per GPU is what the hardware earns, per user is what each user gets;
raising concurrency moves a variant's line left (slower per user) and up (more per GPU) until the
engine saturates. A point on the front is one no other configuration beats on both.

A search's plot (a tune's store: its variants come best first) names its best ``LABELLED`` trials;
the rest are drawn thin and grey, unlabelled, so dozens of trials stay readable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .choose import pareto
from .show import SYNTHETIC

LABELLED = 6  # a search's trials named in the legend, best first


def plot(doc: dict[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    points: list[tuple[float, float]] = []
    search = bool(doc.get("search"))
    drawn = 0
    others = 0
    for v in doc["variants"]:
        xs, ys, cs = [], [], []
        for lv in v["levels"]:
            f = lv["figures"]
            x, y = f.get("output_tok_s_per_user"), f.get("output_tok_s_per_gpu")
            if x is None or y is None or not lv["repeats"]:
                continue
            xs.append(float(x))
            ys.append(float(y))
            cs.append(lv["concurrency"])
        if not xs:
            continue
        points += list(zip(xs, ys, strict=True))
        if search and drawn >= LABELLED:
            others += 1
            ax.plot(xs, ys, marker=".", color="grey", linewidth=0.6, alpha=0.5, zorder=1,
                    label=f"the other trials ({sum(1 for x in doc['variants'] if x['levels']) - LABELLED})"
                    if others == 1 else None)
            continue
        drawn += 1
        label = v["name"] + (" (synthetic timing)" if v["synthetic"] else "") + \
            ("" if v["status"] == "measured" else f" [{v['status']}]")
        line = ax.plot(xs, ys, marker="o", label=label)[0]
        for x, y, c in zip(xs, ys, cs, strict=True):
            ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8,
                        color=line.get_color())
    front = sorted((points[i] for i in pareto(points)), key=lambda p: p[0])
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="black", linewidth=2.5, alpha=0.35,
                zorder=0, label="Pareto front")
        ax.scatter([p[0] for p in front], [p[1] for p in front], s=140, facecolors="none", edgecolors="black",
                   zorder=3)
    best = doc.get("best")
    title = f"experiment {doc['experiment']}"
    if best and search:
        title = f"search {doc['experiment']}: best {best['variant'].split(',')[0]} at c={best['concurrency']}"
    elif best:
        title += f": best under the SLO {best['variant']} at c={best['concurrency']}"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("output tok/s per user (output tokens / median end-to-end latency)")
    ax.set_ylabel("output tok/s per GPU" + (" (per engine: CPU)" if not any(v.get("gpus") for v in doc["variants"])
                                            else ""))
    ax.grid(True, alpha=0.3)
    if points:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "nothing measured yet", ha="center", va="center", transform=ax.transAxes)
    if doc.get("synthetic_note"):
        fig.text(0.01, 0.01, "timing " + SYNTHETIC, fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
