"""What ``plan`` shows for a Slurm inventory: the job, its steps, each engine as the ordinary plan
shows it (slot nodes as ``${GPUDEPLOY_NODE_N}``), and with ``--files`` the batch script and the
steps' environment files."""

from __future__ import annotations

from ..report import plan_recap
from ..report import plan_text as unit_text
from .inventory import PLACEHOLDER_RE, node_variable
from .plan import SlurmPlan
from .script import job_name


def shown(text: str) -> str:
    """Placeholders as the script's variables: what a reader of the batch script sees too."""
    return PLACEHOLDER_RE.sub(lambda m: f"${{{node_variable(int(m.group(1)))}}}", text)


def plan_text(sp: SlurmPlan, *, show_files: bool = False) -> str:
    t = sp.inv.target
    nodes = ",".join(t.nodelist) if t.nodelist else f"any {t.nodes}" + (f" with {t.constraint}" if t.constraint else "")
    out = [f"== Slurm job {job_name(sp.deployment)} via {t.login.address}: partition {t.partition}, "
           f"nodes {nodes}, gpu:{t.gpus_per_node} per node, time {t.time}, output in {t.output_dir}"]
    for s in sp.steps:
        gpus = ",".join(map(str, s.unit.gpus)) or "-"
        out.append(f"   step {s.name:<28} slot {s.slot} (${{{node_variable(s.slot)}}})  gpus {gpus}  "
                   f"cpus {s.unit.cpus or '-'}")
    out.append("")
    # the systemd files the ordinary plan names are not what a Slurm target writes
    units = [line for line in unit_text(sp.plan, show_files=False).splitlines() if not line.startswith("   files ")]
    recap_at = next((i for i, line in enumerate(units) if line.startswith("recap ")), len(units))
    out += [shown(line) for line in units[:recap_at]]
    if show_files:
        out.append(f"--- batch script (sbatch on {t.login.address}) ---")
        out.append(sp.script.rstrip("\n"))
        for path, text in sp.files().items():
            out.append(f"--- {path} (mode 0600, sourced by its step) ---")
            out.append(text.rstrip("\n"))
        out.append("")
    else:
        out.append("(the batch script and the steps' environment files: plan --files)")
        out.append("")
    out += [shown(line) for line in units[recap_at:]]
    return "\n".join(out) + "\n"


def refuses(sp: SlurmPlan) -> bool:
    return plan_recap(sp.plan)[1]
