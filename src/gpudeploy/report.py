"""Human and JSON views of a plan. Secrets are already masked in the plan; nothing here unmasks."""

from __future__ import annotations

import time
from typing import Any

from .controlchars import printable
from .flagcache import Learned
from .model import Plan, Unit
from .plan.build import SECRET_MASK
from .plan.flags import PROGRAM, flags_source
from .plan.process_spec import numa_binding


def plan_json(plan: Plan) -> dict[str, Any]:
    """The documented ``invoke plan --json`` shape (see README, "plan --json"), with the recap:
    per unit what deploy would do (``verdict``), and whether it would refuse any."""
    verdicts = unit_verdicts(plan)
    return {
        "inventory": plan.inventory.path,
        "deployment": plan.inventory.deployment,
        "units": [{**unit_json(u), "verdict": {k: v[k] for k in ("verdict", "reasons", "fix")}}
                  for u, v in zip(plan.units, verdicts, strict=True)],
        "deploy_would_refuse": any(v["verdict"] == "refuse" for v in verdicts),
    }


def unit_json(u: Unit) -> dict[str, Any]:
    return {
        "host": u.host.name,
        "address": u.host.address,
        "role": u.role.name,
        "engine": u.role.engine,
        "engine_version": u.engine_version,
        "flags_release": u.flags_release or u.engine_version,
        "flag_notes": list(u.flag_notes),
        "unit": u.name,
        "gpus": list(u.gpus),
        "numa_node": u.numa_node,
        "cpus": u.cpus,
        "ports": dict(u.ports),
        "argv": list(u.argv),
        "env": {**u.env, **{s: SECRET_MASK for s in u.secret_names}},
        "secrets": list(u.secret_names),
        "health": {"url": u.health_url, "timeout_s": u.role.health.timeout_s, "stall_s": u.role.health.stall_s,
                   "on_stall": u.role.health.on_stall},
        "files": dict(u.files),
        "memory": u.memory,
        "flags": flags_json(u),
        "group": None if u.group is None else {"nnodes": u.group.nnodes, "rank": u.group.rank,
                                               "members": list(u.group.members), "dist_init": u.group.dist_init},
    }


def learned_flags(u: Unit) -> Learned | None:
    """The help text learned from a host that the unit's flags were checked against (None: captured)."""
    program = PROGRAM.get(u.role.engine)
    return flags_source(program, u.engine_version, u.host.name) if program and u.engine_version else None


def flags_json(u: Unit) -> dict[str, Any] | None:
    if not PROGRAM.get(u.role.engine) or not u.engine_version:
        return None
    learned = learned_flags(u)
    if learned is None:
        return {"source": "captured"}
    teacher = learned.teacher(u.host.name)
    return {"source": "learned", "release": learned.release, "sha256": learned.digest,
            "learned_from": teacher[0] if teacher else None, "learned_at": teacher[1] if teacher else None}


def plan_text(plan: Plan, *, show_files: bool = False) -> str:
    """Per unit what would run where, then the recap (:func:`plan_recap`); the unit and env files'
    text only with ``show_files`` (``plan --files``): it was two thirds of the output."""
    if not plan.units:
        return "nothing to run for this selection\n"
    from .plan.memcheck import own_roles_folder, unit_memory_verdict

    folder = own_roles_folder(plan.inventory)
    out: list[str] = []
    for u in plan.units:
        out.append(f"== {u.host.name} ({u.host.address}) / {u.role.name}: {u.name}")
        gpus = ",".join(map(str, u.gpus)) or "-"
        numa = "-" if u.numa_node is None else str(u.numa_node)
        out.append(f"   engine   {u.role.engine} {u.engine_version or ''}".rstrip())
        learned = learned_flags(u)
        if learned is not None:
            out.append(f"   flags    {learned.describe(u.host.name).removeprefix('flags ')}")
        if u.flags_release:
            out.append(f"   flags    of {u.flags_release}, the nearest release gpudeploy has captured: "
                       f"{u.engine_version} is not captured, so `invoke deploy` reads its --help from "
                       f"{u.host.name} and checks the command line again before anything starts")
        out.extend(f"   flags    warning: {note}" for note in u.flag_notes)
        out.append(f"   gpus     {gpus}   numa node {numa}   cpus {u.cpus or '-'}")
        bound = numa_binding(u)
        if bound is not None:
            out.append(f"   memory   {bound['policy']} to NUMA node(s) {','.join(map(str, bound['nodes']))} "
                       "(systemd: NUMAPolicy=; without systemd: set_mempolicy before exec, and deploy says so "
                       "where the host refuses it)")
        if u.group is not None:
            g = u.group
            lead = "leader" if g.rank == 0 else f"leader {g.leader}"
            out.append(f"   group    node rank {g.rank} of {g.nnodes} ({lead}; dist-init {g.dist_init}; "
                       f"ranks on {', '.join(g.members)})")
        out.append("   ports    " + "  ".join(f"{k}={v}" for k, v in u.ports.items()))
        out.append(f"   health   {u.health_url}")
        out.append("   command  " + " ".join(u.argv))
        env = {**u.env, **{s: SECRET_MASK for s in u.secret_names}}
        out.append("   env      " + ("  ".join(f"{k}={v}" for k, v in env.items()) or "-"))
        if u.memory:
            out.append(memory_line(u.memory, unit_memory_verdict(u, folder).fix))
        if show_files:
            for path, text in u.files.items():
                out.append(f"   --- {path}")
                out.extend("   | " + line for line in text.rstrip("\n").splitlines())
        else:
            out.append(f"   files    {', '.join(u.files)} (their text: plan --files)")
        out.append("")
    out.append(plan_recap(plan)[0])
    return "\n".join(out)


def unit_verdicts(plan: Plan) -> list[dict[str, Any]]:
    """Per unit what deploy would do with it: ``ok``, ``warn`` (it says so and goes ahead) or
    ``refuse`` (it stops before touching any host, unless --force), why, and the fix."""
    from .plan.memcheck import own_roles_folder, unit_memory_verdict

    folder = own_roles_folder(plan.inventory)
    out = []
    for u in plan.units:
        v = unit_memory_verdict(u, folder)
        reasons = [x for x in (v.said, *(f"memory preflight: {n}" for n in v.notes)) if x]
        if u.flags_release:
            reasons.append(f"flags of {u.flags_release} until deploy reads {u.engine_version}'s own --help on "
                           f"{u.host.name}")
        reasons.extend(u.flag_notes)
        severity = "warn" if u.flag_notes and v.severity == "ok" else v.severity
        out.append({"unit": u.key, "verdict": severity, "reasons": reasons, "fix": v.fix})
    return out


def plan_recap(plan: Plan) -> tuple[str, bool]:
    """The last lines of ``plan``: one per unit (ok / warn / refuse, why, the fix), then whether
    deploy would go ahead; and whether it would refuse (``plan`` then exits 2)."""
    verdicts = unit_verdicts(plan)
    width = max((len(v["unit"]) for v in verdicts), default=0)
    lines = ["recap (what deploy would do):"]
    for v in verdicts:
        lines.append(f"  {v['unit']:<{width}}  {v['verdict'].upper():<6}  " + ("; ".join(v["reasons"]) or "-"))
        if v["fix"]:
            lines.append(f"  {'':<{width}}          {'fix' if v['verdict'] == 'refuse' else 'safer'}: {v['fix']}")
    refused = [v["unit"] for v in verdicts if v["verdict"] == "refuse"]
    warned = sum(1 for v in verdicts if v["verdict"] == "warn")
    if refused:
        lines.append(f"deploy would REFUSE {', '.join(refused)} (deploy --force overrides the memory preflight); "
                     "plan exits 2")
    else:
        lines.append(f"deploy would go ahead with {len(verdicts)} unit(s)"
                     + (f", warning about {warned}" if warned else ""))
    return "\n".join(lines) + "\n", bool(refused)


def memory_line(mem: dict[str, Any], fix: str = "") -> str:
    """The per-rank budget table: what the memory preflight predicts, what it assumes, and measured
    where known. A verdict that is not a plain fit says what it is about and the edit that fixes it
    before the figures; a margin is shown only where the check reached the headroom (an empty KV pool
    leaves a large "available" headroom that is no margin at all)."""
    from .plan.memcheck import headroom_margin

    if mem.get("verdict") == "unknown":
        return f"   memory   unknown: {mem.get('reason')}"
    frac = f"{mem['fraction']:.3f}" + (" (SGLang default)" if mem.get("fraction_is_default") else "")
    severity = mem.get("severity", "ok")
    tag = {"warn": "   WARNING: inside the estimate's error, deploy goes ahead",
           "refuse": "   deploy refuses this unit (or --force)"}.get(severity, "")
    plain = mem["verdict"] == "fits" and severity == "ok"
    rows = [f"   memory   verdict {mem['verdict'].upper()}{tag}" + ("   per GPU rank, GiB:" if plain else "")]
    if not plain:
        rows.append(f"              why: {mem['reason']}")
        advice = "fix" if severity == "refuse" else "safer" if severity == "warn" else "recommended"
        rows.append(f"              {advice}: {fix or mem.get('message') or 'none found'}"
                    + (f"; needs {mem['needs_more_gpus']} GPUs" if mem.get("needs_more_gpus") and not fix else ""))
        rows.append("              per GPU rank, GiB:")
    rows += [
        f"              capacity {mem['capacity_gib']:.1f}   free before load {mem['preload_free_gib']:.2f}"
        f"   mem-fraction-static {frac}",
        f"              weights {mem['weights_gib']:.2f}   KV pool {mem['kv_pool_gib']:.2f}"
        f" ({mem['kv_tokens']} tokens)" + (f"   state {mem['state_gib']:.2f}" if mem.get("state_gib") else ""),
    ]
    margin = headroom_margin(mem)
    if margin is None:
        rows.append(f"              headroom not reached: the check stops at {mem['verdict']} (why: above)"
                    if not plain else f"              headroom available {mem['headroom_available_gib']:.2f}")
    else:
        rows.append(f"              headroom needed {mem['headroom_needed_gib']:.2f} vs available "
                    f"{mem['headroom_available_gib']:.2f}  ("
                    + ", ".join(f"{k} {v:.2f}" for k, v in mem.get("headroom_breakdown", {}).items()) + ")")
    if plain:
        rows.append(f"              {mem['reason']}")
    if margin is not None:
        rows.append(f"              headroom margin {margin:+.2f} GiB, error band +-{mem['error_band_gib']:.2f} GiB"
                    f" (SGLang {mem.get('release_rules')} rules)")
    terms = mem.get("band_terms") or {}
    if terms and margin is not None:
        rows.append("              band by term: " + ", ".join(f"{k} {v:+.2f}" if v < 0 else f"{k} +-{v:.2f}"
                                                             for k, v in terms.items() if abs(v) >= 0.005))
    table = mem.get("on_the_table") or {}
    if table:
        rows.append(f"              left on the table: {table['spare_gib']:.2f} GiB of headroom beyond the band; "
                    f"mem_fraction_static {table['mem_fraction_static']} takes it: {table['kv_tokens']} KV tokens "
                    f"(+{table['kv_tokens_gained']}), {table['running_requests']} running requests "
                    f"(+{table['running_requests_gained']}), still {table['margin_gib']:.2f} GiB spare for a "
                    f"+-{table['error_band_gib']:.2f} GiB band")
    inputs = mem.get("inputs") or []
    guessed = [i for i in inputs if not i.get("grounded")]
    if guessed:
        rows.append("              assumed: " + "; ".join(
            f"{i['name']} ({i['source']}" + (f", +-{i['band_gib']:.2f} GiB" if i.get("band_gib") else "")
            + f"; certain with {i['certain_by']})" for i in guessed))
    grounded = [i["name"] for i in inputs if i.get("grounded")]
    if grounded:
        rows.append("              grounded: " + ", ".join(grounded))
    # where the facts read on a host came from: the user sees which host and when, not only that
    rows += [f"              {i['name']}: {i['source']}" for i in inputs
             if i.get("grounded") and (i["name"] == "release defaults" or " read on " in str(i.get("source")))]
    rows += [f"              note: {n}" for n in mem.get("notes") or []]
    for name, cmp in (mem.get("measured") or {}).items():
        if isinstance(cmp, dict) and "measured" in cmp:
            rows.append(f"              measured {name}: {cmp['measured']} (predicted {cmp['predicted']})")
    if mem.get("lesson"):
        rows.append(f"              learned: {mem['lesson']}")
    for sug in mem.get("suggestions", []):
        drop = " ".join(sug.get("remove") or [])
        rows.append(f"              fits: {' '.join(sug['flags']) or '(as is)'}"
                    + (f" and drop {drop}" if drop else "") + f" -> {sug['kv_tokens']} KV tokens, "
                    f"{sug['running_requests']} running requests"
                    + ("" if sug["speculative"] else ", speculative decoding off"))
    return "\n".join(rows)


def deploy_summary(result: Any) -> tuple[str, bool]:
    """Per host and unit: what happened, the endpoint and PIDs, or the cause and next step; then per
    deployment: ready (with the smoke generation's timing) or failed, and what runs where now."""
    from .errors import GpudeployError

    out: list[str] = []
    ok = True
    for host, res in result.hosts.items():
        if isinstance(res, GpudeployError):
            ok = False
            out.append(f"{host}: FAILED: {res}")
            continue
        for o in res:
            u = o.unit
            tag = f"{host}/{u.role.name}"
            if o.ok and o.action.startswith("would"):
                out.append(f"{tag}: {o.action} (--check: nothing was changed)")
            elif o.ok:
                pids = f" pids {','.join(map(str, o.pids))}" if o.pids else ""
                mem = memory_figures(o.gate.lines) if o.gate else ""
                when = f" in {o.gate.elapsed_s:.1f} s" if o.gate else ""
                stopped = f" (then {o.message})" if o.message.startswith("stopped") else ""
                out.append(f"{tag}: {o.action}{when}: {u.health_url.rsplit('/', 1)[0]}  MainPID {o.main_pid}{pids}"
                           + stopped + (f"\n    {mem}" if mem else ""))
            else:
                ok = False
                out.append(f"{tag}: FAILED ({o.action})" + (f" {o.message}" if o.message else ""))
                if o.gate and o.gate.cause:
                    out.append("    " + o.gate.cause.render().replace("\n", "\n    "))
                    if o.message == "stopped":
                        out.append("    the unit was stopped so its GPUs are free again")
    for dep in result.deployments.values():
        ok = ok and dep.ok
        out.append(deployment_line(dep))
    if len(result.deployments) > 1:
        out.append(summary_line(result))
    return printable("\n".join(out), lines=True), ok  # causes quote the servers' lines


def summary_line(result: Any) -> str:
    """One line for a fleet: how many deployments ended how, and the units' outcomes."""
    from collections import Counter

    from .errors import GpudeployError

    deps = list(result.deployments.values())
    ready = sum(1 for d in deps if d.ok)
    untouched = sum(1 for d in deps if d.untouched)
    failed = len(deps) - ready - untouched
    units = Counter(o.action if o.ok else "failed" for res in result.hosts.values()
                    if not isinstance(res, GpudeployError) for o in res)
    hosts_failed = sum(1 for res in result.hosts.values() if isinstance(res, GpudeployError))
    parts = [f"{n} {a}" for a, n in sorted(units.items())]
    return (f"summary: {len(deps)} deployments: {ready} ready, {failed} failed, {untouched} left untouched; "
            f"units: {', '.join(parts) or 'none'}" + (f"; {hosts_failed} hosts unreachable or failed" if hosts_failed
                                                     else ""))


def deploy_records(result: Any) -> dict[str, Any]:
    """`deploy --json`: one record per host and unit (phase reached, outcome, cause, duration) and
    one per deployment."""
    from .errors import GpudeployError

    units = []
    for host, res in result.hosts.items():
        if isinstance(res, GpudeployError):
            units.append({"host": host, "unit": None, "outcome": "host-failed", "cause": str(res)})
            continue
        for o in res:
            cause = o.gate.cause if o.gate else None
            units.append({"host": host, "deployment": o.unit.deployment, "role": o.unit.role.name,
                          "unit": o.unit.name, "outcome": o.action if o.ok else "failed", "action": o.action,
                          "ok": o.ok, "phase": o.gate.phase if o.gate else None,
                          "duration_s": round(o.gate.elapsed_s, 3) if o.gate else None,
                          "cause": {"kind": cause.kind, "summary": cause.summary, "next_step": cause.next_step}
                          if cause else (o.message or None), "main_pid": o.main_pid, "pids": o.pids})
    deployments = [{"deployment": d.name, "ok": d.ok, "batch": d.batch, "untouched": d.untouched,
                    "failure": d.failure or None, "stopped": d.stopped, "running": d.running,
                    "smoke": [{"router": u.key, "ok": r.ok, "endpoint": r.endpoint, "ttft_s": r.ttft_s,
                               "total_s": round(r.total_s, 3), "text": r.text[:200], "message": r.message or None}
                              for u, r in d.smoke]} for d in result.deployments.values()]
    return {"units": units, "deployments": deployments, "ok": all(d["ok"] for d in deployments)}


def deployment_line(dep: Any) -> str:
    def smoke(u: Any, r: Any) -> str:
        ttft = f"TTFT {r.ttft_s:.3f} s, " if r.ttft_s is not None else ""
        got = f"{ttft}total {r.total_s:.3f} s, text {r.text.strip()[:50]!r}" if r.ok else f"FAILED: {r.message}"
        return f"smoke {r.endpoint} through {u.key}: {got}"

    smokes = [smoke(u, r) for u, r in dep.smoke]
    if dep.untouched:
        return f"deployment {dep.name}: NOT DEPLOYED, left untouched: {dep.failure}"
    rolled = [f"    rolled: {step}" for step in getattr(dep, "rolled", [])]
    if dep.ok:
        return f"deployment {dep.name}: READY" + "".join(f"\n{r}" for r in rolled) + \
            "".join(f"\n    {s}" for s in smokes)
    lines = [f"deployment {dep.name}: FAILED: {dep.failure}", *rolled, *(f"    {s}" for s in smokes)]
    if dep.stopped:
        lines.append("    stopped what this run started: " + ", ".join(dep.stopped))
    if dep.restored:
        lines.append("    back on the files they ran from before this deploy: " + ", ".join(dep.restored))
    lines.append("    running now: " + (", ".join(dep.running) if dep.running else "nothing of this deployment"))
    return "\n".join(lines)


def interrupted_text(result: Any) -> str:
    """After Ctrl-C: exactly what this run left starting, where, and how to stop it."""
    from .errors import GpudeployError

    results = result.hosts
    left = [(host, o) for host, res in results.items() if not isinstance(res, GpudeployError)
            for o in res if getattr(o, "left_running", False)]
    unknown = [host for host, res in results.items() if isinstance(res, GpudeployError)]
    extra = [line for dep in result.deployments.values() for line in getattr(dep, "left", [])]
    lines = ["interrupted (Ctrl-C)."]
    if left:
        lines.append("left running, still starting:")
        lines += [f"  {host}/{o.unit.role.name}: {o.unit.name} MainPID {o.main_pid} "
                  f"(`invoke teardown --host {host} --role {o.unit.role.name}` stops it)" for host, o in left]
    elif not extra:
        lines.append("nothing this run started is left starting.")
    if extra:
        lines.append("left running by an interrupted rolling update:")
        lines += [f"  {line}" for line in extra]
    if unknown:
        lines.append("not known (the host did not answer in time): " + ", ".join(unknown)
                     + "; `invoke status` shows what runs there")
    return "\n".join(lines)


def memory_figures(lines: list[str]) -> str:
    """The memory figures the engine logged, in one line (empty if it logged none)."""
    import re

    keep = []
    # 0.5.9 and 0.5.23 spellings: "KV Cache is allocated. [dtype: D, ]#tokens: N",
    # "Capture cuda graph end. ..." / "Capture target decode|verify CUDA graph end. ..."
    for pattern, label in ((r"Load weight end.*?mem usage=([\d.]+) GB", "weights"),
                           (r"KV Cache is allocated\. (?:dtype: [\w.]+, )?#tokens: (\d+)", "KV tokens"),
                           (r"Capture (?:cuda graph|target (?:decode|verify) CUDA graph) end.*?mem usage=([\d.]+) GB",
                            "cuda graphs"),
                           (r"available_gpu_mem=([\d.]+) GB", "free after start")):
        for line in lines:
            m = re.search(pattern, line)
            if m:
                unit = "" if label == "KV tokens" else " GiB"
                keep.append(f"{label} {m.group(1)}{unit}")
                break
    return "memory: " + ", ".join(keep) if keep else ""


def status_text(results: dict[str, Any]) -> tuple[str, bool]:
    """One table, grouped by deployment; next to each engine, how its router sees it."""
    from .errors import GpudeployError
    from .verify.status import fmt_uptime, gpu_words

    head = ("DEPLOYMENT", "HOST", "ROLE", "STATE", "PID", "UPTIME", "PORTS", "HEALTH", "GPUS", "ROUTER")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    ok = True
    for host, res in results.items():
        if isinstance(res, GpudeployError):
            rows.append(("-", host, "-", "UNREACHABLE", "-", "-", "-", "-", "-", "-"))
            notes.append(f"{host}: {res}")
            continue
        if not res:
            rows.append(("-", host, "-", "no gpudeploy units", "-", "-", "-", "-", "-", "-"))
        for s in res:
            if s.deployed and not s.healthy:
                ok = False
            ports = ",".join(f"{k}={v}" for k, v in s.ports.items()) or "-"
            if s.workers is not None:
                healthy = sum(1 for w in s.workers if w["healthy"])
                router = f"{healthy}/{len(s.workers)} workers healthy"
            else:
                router = "; ".join(s.router_view) or "-"
            rows.append((s.deployment, host, s.role, s.state, str(s.main_pid or "-"), fmt_uptime(s.uptime_s), ports,
                         s.health, gpu_words(s.gpu_health), router))
            for g, h in sorted(s.gpu_health.items()):
                if h["word"] not in ("ok", "-"):
                    notes.append(f"{host}/{s.role}: GPU {g} {h['word'].upper()}: " + "; ".join(h["why"]))
            if s.gpu_memory:
                notes.append(f"{host}/{s.role}: GPU memory held by this run: "
                             + ", ".join(f"GPU {g} {v:.1f} GiB" for g, v in sorted(s.gpu_memory.items())))
            if s.gpu_load and s.deployed:
                notes.append(f"{host}/{s.role}: {gpu_load_text(s.gpu_load, s.gpu_standin)}")
            if s.group:
                notes.append(f"{host}/{s.role}: {s.group}"
                             + (f"; the group is DOWN: {s.group_down}" if s.group_down else ""))
            if s.last_failure:
                notes.append(f"{host}/{s.role}: last failure: {s.last_failure}"
                             + (f"\n    next step: {s.next_step}" if s.next_step else ""))
            if s.orphans:
                notes.append(f"{host}/{s.role}: processes of the unit still alive while it is {s.state}: "
                             + ", ".join(f"{p['pid']} ({p['cmd'][:60]})" for p in s.orphans)
                             + " -- `invoke teardown` kills them by PID")
    rows.sort(key=lambda r: (r[0] == "-", r[0]))  # by deployment; hosts without units last
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return printable("\n".join(lines + (["", *notes] if notes else [])), lines=True), ok  # hosts' words in it


def gpu_load_text(load: dict[int, dict[str, Any]], standin: str | None) -> str:
    """Per GPU what it draws of its limit and how busy its SMs are (NVML, now), with the total."""
    def watts(v: Any) -> str:
        return f"{v:.0f}" if isinstance(v, (int, float)) else "?"

    parts = []
    for g, d in sorted(load.items()):
        limit = f"/{watts(d.get('power_limit_w'))}" if d.get("power_limit_w") is not None else ""
        sm = f" SM {d['sm_util_pct']:.0f}%" if d.get("sm_util_pct") is not None else ""
        parts.append(f"GPU {g} {watts(d.get('power_w'))}{limit} W{sm}")
    drawn = [d["power_w"] for d in load.values() if isinstance(d.get("power_w"), (int, float))]
    total = f"; {sum(drawn):.0f} W in all" if len(drawn) > 1 else ""
    fake = " (a stand-in NVML: modelled, not measured)" if standin else ""
    return "power and utilisation now: " + ", ".join(parts) + total + fake


def facts_text(results: dict[str, Any], hosts: dict[str, Any]) -> tuple[str, bool]:
    """`invoke facts`: per host, its GPUs as NVML reports them (or the inventory's, marked so),
    CPUs and NUMA nodes, init system, engines, and every way it differs from the inventory."""
    from .errors import GpudeployError
    from .facts.check import layout_problems
    from .facts.health import findings

    out: list[str] = []
    ok = True
    for name, res in results.items():
        if isinstance(res, GpudeployError):
            ok = False
            out.append(f"== {name}: UNREACHABLE: {res}")
            continue
        host = hosts[name]
        source = "NVML" + (f", driver {res.driver}" if res.driver else "") if res.source == "nvml" else \
            f"no NVML ({res.nvml_error}): the GPUs below are the INVENTORY's, not read from the host"
        out.append(f"== {name} ({host.address})  init: {res.init}  GPUs: {source}")
        rows = [("GPU", "NAME", "UUID", "BUS ID", "NUMA", "TOTAL GiB", "USED", "FREE", "HEALTH", "PROCESSES")]
        for g in res.gpus:
            procs = [p for p in res.processes if p["gpu"] == g["index"]]
            rows.append((str(g["index"]), g["name"] or "-", g["uuid"] or "-", g["bus_id"] or "-",
                         "-" if g["numa_node"] is None else str(g["numa_node"]),
                         "-" if g["total"] is None else f"{g['total'] / 2**30:.1f}",
                         "-" if g["used"] is None else f"{g['used'] / 2**30:.1f}",
                         "-" if g["free"] is None else f"{g['free'] / 2**30:.1f}", health_word(g),
                         ", ".join(f"{p['pid']} {p['used'] / 2**30:.1f} GiB {p['cmd'][:40]}" for p in procs) or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        for g in res.gpus:
            if isinstance(g.get("health"), dict):
                out.append(f"  GPU {g['index']}: " + gpu_health_text(g["health"]))
                out += [f"    {f.word.upper()}: {f.text()}" for f in findings(g)]
        out += kernel_log_text(res.xids)
        topo = res.topology or {}
        nodes = "; ".join(f"node {n}: {cpus}" for n, cpus in sorted((topo.get("numa_nodes") or {}).items()))
        out.append(f"  CPUs: {topo.get('cpus', '?')}" + (f"  NUMA {nodes}" if nodes else ""))
        for python, found in sorted(res.versions.items()):
            shown = found.get("error") or ", ".join(f"{k} {v or 'not found'}" for k, v in found.items())
            out.append(f"  engines with {python}: {shown}")
        if res.source == "nvml":
            problems = layout_problems(host, res.gpus)
            ok = ok and not problems
            out += [f"  DIFFERS FROM THE INVENTORY: {p}" for p in problems] or ["  matches the inventory's GPUs"]
    return printable("\n".join(out), lines=True), ok  # GPU names, processes' command lines


def health_word(device: dict[str, Any]) -> str:
    """The GPU's health word for the table, in capitals when it is not ok (its reasons follow the table)."""
    from .facts.health import word

    w = word(device)
    return w if w in ("ok", "-") else w.upper()


def gpu_health_text(h: dict[str, Any]) -> str:
    """Every health field NVML gave for one GPU, "n/a" where it cannot say (facts/gpu_health.py)."""
    if h.get("lost") or h.get("reset_required"):
        return f"{'LOST' if h.get('lost') else 'NEEDS A RESET'} ({h.get('error', '')})"
    na = "n/a"
    rows = h.get("remapped_rows")
    pages = h.get("retired_pages")
    ecc = h.get("ecc")
    clocks = h.get("clocks_event_reasons")
    pcie = h.get("pcie")
    nvlink = h.get("nvlink")

    def yes(v: Any) -> str:
        return na if v is None else ("yes" if v else "no")

    parts = [
        "remapped rows " + (f"{rows['correctable']} correctable/{rows['uncorrectable']} uncorrectable, pending "
                            f"{yes(rows['pending'])}, failed {yes(rows['failed'])}" if rows else na),
        *([f"retired pages {pages['single_bit']} single-bit/{pages['double_bit']} double-bit, pending "
           f"{yes(pages['pending'])}"] if pages else []),
        "ECC " + (f"{'on' if ecc.get('enabled') else 'off' if ecc.get('enabled') is False else na}, uncorrected "
                  f"{_n(ecc.get('uncorrected_volatile'))} volatile/{_n(ecc.get('uncorrected_aggregate'))} aggregate, "
                  f"corrected {_n(ecc.get('corrected_volatile'))} volatile" if ecc else na),
        "clocks " + (", ".join(clocks["reasons"]) or "no event reason" if clocks else na),
        f"{h['temperature_c']} C" if h.get("temperature_c") is not None else f"temperature {na}",
        "PCIe " + (f"gen{_n(pcie.get('gen'))} x{_n(pcie.get('width'))} of gen{_n(pcie.get('max_gen'))} "
                   f"x{_n(pcie.get('max_width'))}" if pcie else na),
        "NVLink " + (f"{nvlink['active']}/{nvlink['links']} up"
                     + (f", down: {nvlink['down']}" if nvlink["down"] else "") if nvlink else "none"),
    ]
    return "; ".join(parts)


def _n(v: Any) -> str:
    return "?" if v is None else str(v)


def kernel_log_text(kernel: dict[str, Any]) -> list[str]:
    """The driver's Xid lines since boot, each with its GPU, time, meaning and what to do."""
    from .verify import xid

    if not kernel:
        return []
    if kernel.get("error"):
        return [f"  kernel log: not read: {kernel['error']}"]
    found = kernel.get("xids") or []
    where = {"journal": "journalctl -k", "kmsg": "/dev/kmsg", "dmesg": "dmesg"}.get(str(kernel.get("source")),
                                                                                   str(kernel.get("source")))
    if not found:
        return [f"  kernel log ({where}): no Xid since boot"]
    out = [f"  kernel log ({where}): {len(found)} Xid line(s) since boot:"]
    for x in found[-20:]:
        day = time.strftime("%Y-%m-%d", time.localtime(float(x["at"])))
        out.append(f"    {day} {xid.sentence(x)}; {xid.todo(x)}")
        out.append(f"      | {x.get('text', '')}")
    return out


def roles_text(found: list[Any]) -> str:
    """`gpudeploy roles`: each role a placement may name, its engine and description, and its file."""
    import yaml

    rows = [("ROLE", "ENGINE", "DESCRIPTION", "FROM")]
    for r in found:
        try:
            doc = yaml.safe_load(r.path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        where = "packaged" if r.source == "packaged" else str(r.path) + ("  (overrides the packaged one)"
                                                                          if r.overrides else "")
        rows.append((r.name, str(doc.get("engine", "?")), str(doc.get("description", ""))[:48], where))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3]]) for row in rows]
    packaged = next((r.path.parent for r in found if r.source == "packaged"), None)
    if packaged is not None:
        lines.append(f"packaged roles: {packaged}; a file of the same name in the inventory's roles_dir overrides one")
    return "\n".join(lines)
