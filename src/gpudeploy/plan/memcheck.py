"""The memory preflight of one SGLang unit, as plan data: verdict, numbers, recommended flags.

Model facts come from ``model.facts`` in the role (explicit numbers, for models that live only on
the GPU node) or from the model directory when it is readable here. Without either, the verdict is
``unknown`` and deploy says so rather than guessing. The arithmetic is :mod:`gpudeploy.memory`'s;
this module feeds it the role, the host and what earlier runs measured, and checks that what it
recommends passes the same check once merged into the role's settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import defaultscache
from ..errors import InputError, Problem
from ..library import PACKAGED_ROLES
from ..memory import EngineSettings, budget, recommendation_flags, suggest
from ..memory.logparse import Measured
from ..memory.modelfacts import ModelFacts, model_facts_from_config, model_facts_from_dir, model_facts_from_mapping
from ..model import Host, Inventory, Plan, Role, Unit
from ..yamlsrc import LineMap
from .calibrate import CalibrationStore
from .flags import flag_for

# The inventory gives a GPU's memory as NVML reports it; CUDA programs see about 0.6 GiB less
# (H200: NVML 140.4 GiB, torch "total capacity of 139.80 GiB"; a 96 GB card: 95.6 vs 95.0).
CUDA_RESERVED_GIB = 0.6
DEFAULT_STORE = Path(os.environ.get("GPUDEPLOY_CALIBRATION",
                                    Path.home() / ".local/state/gpudeploy/calibration.json"))


def model_facts(role: Role, problems: list[Problem], host: str | None = None) -> ModelFacts | None:
    """The role's ``model.facts``, else its model folder here, else what ``host``'s probe read of that
    folder on the host (``defaultscache``: a model that lives only on the GPU node), else None."""
    facts = role.model.get("facts")
    path = role.model.get("path")
    try:
        if isinstance(facts, dict):
            return model_facts_from_mapping(facts, where=role.file)
        if path and (Path(str(path)) / "config.json").is_file():
            return model_facts_from_dir(str(path))
        kept = defaultscache.lookup_model(host, str(path)) if path and host else None
        if kept is not None:
            return model_facts_from_config(kept[0], kept[1], f"{host}:{path}/config.json", Path(str(path)).name)
    except InputError as exc:
        problems.extend(Problem(p.message, file=p.file or role.file, line=_fact_line(role, facts, p.key),
                                role=role.name, key=f"model.facts.{p.key}" if p.key and isinstance(facts, dict)
                                else p.key)
                        for p in exc.problems)
    return None


def _fact_line(role: Role, facts: Any, key: str | None) -> int | None:
    """The line of the fact itself in the role file, else of ``model.facts``, else of ``model``."""
    if isinstance(facts, LineMap) and key in facts.key_lines:
        return facts.key_lines[key]
    return role.lines.get("model.facts", role.lines.get("model"))


def gpu_mib(host: Host, gpus: tuple[int, ...]) -> float:
    """The GPU memory SGLang reads for a unit (nvidia-smi's memory.total, the least of the host's
    GPUs: utils/common.py get_nvgpu_memory_capacity), as the inventory gives NVML's figure."""
    return min(host.gpu_memory_gib[g] for g in gpus) * 1024


def merged_settings(settings: Mapping[str, Any], recommended: Mapping[str, Any]) -> dict[str, Any]:
    """The role's settings with a recommendation applied: a ``None`` removes the setting, and turning
    speculative decoding off removes every ``speculative_*`` setting the role has."""
    out = dict(settings)
    for name, value in recommended.items():
        if name == "tp_size":
            continue
        if value is None:
            out.pop(name, None)
            if name == "speculative_algorithm":
                for key in [k for k in out if k.startswith("speculative_")]:
                    out.pop(key)
        else:
            out[name] = value
    return out


def removed_settings(settings: Mapping[str, Any], recommended: Mapping[str, Any]) -> list[str]:
    """The role's settings a recommendation drops."""
    merged = merged_settings(settings, recommended)
    return [k for k in settings if k not in merged]


def _measured_for(store: CalibrationStore | None, host: Host, role: Role,
                  model_id: str) -> tuple[Measured | None, EngineSettings | None]:
    measured = store.get(host.name, model_id, role.settings) if store else None
    if measured is not None or store is None:
        return measured, None
    # a run under other settings (the failed one, before its recommendation was applied)
    found = store.latest(host.name, model_id)
    if found is None:
        return None, None
    try:
        return found[1], EngineSettings.from_settings(found[0], role.tp_size)
    except InputError:
        return None, None


def unit_memory(host: Host, role: Role, gpus: tuple[int, ...], version: str, store: CalibrationStore | None,
                problems: list[Problem], *, want_suggestions: bool = False, flags_release: str | None = None,
                gpu_name: str | None = None, free_gib: float | None = None,
                argv: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The unit's memory preflight; ``flags_release`` spells the flags (the nearest captured release
    when ``version`` was not captured); ``gpu_name``/``free_gib`` are NVML's at deploy; ``argv``: the
    unit's command line, whose release defaults an earlier deploy may have asked of the release
    (``defaultscache``: then they are the release's own, else the captured rules' reading)."""
    if role.engine != "sglang" or not gpus:
        return None
    facts = model_facts(role, problems, host.name)  # its problems are reported whatever the GPUs' memory
    if any(g not in host.gpu_memory_gib for g in gpus):
        return None         # the inventory's problem with gpu_memory_gib is reported; no capacity to check
    if facts is None:
        return {"verdict": "unknown", "recommended": {},
                "reason": "no model facts: the model dir is not readable here, the role has no model.facts, "
                          "and no deploy has read the model's config.json and safetensors index on the host yet"}
    try:
        settings = EngineSettings.from_settings(role.settings, role.tp_size, where=role.file)
    except InputError as exc:
        problems.extend(exc.problems)
        return None
    capacity = min(host.gpu_memory_gib[g] for g in gpus) - CUDA_RESERVED_GIB
    model_id = str(role.model.get("path", role.name))
    measured, measured_settings = _measured_for(store, host, role, model_id)
    asked = (defaultscache.lookup("sglang", version, gpu_mib(host, gpus), defaultscache.launch_args(argv))
             if argv else None)
    kw: dict[str, Any] = {"release": version, "gpu_name": gpu_name, "free_gib": free_gib, "asked": asked}
    b = budget(capacity, facts, settings, measured, measured_settings, **kw)
    spelling = flags_release or version

    def flag(name: str) -> str:
        return flag_for("sglang", spelling, name, host.name)

    def passes(rec: Mapping[str, Any]) -> bool:
        """The recommendation merged into the role's settings passes the same check."""
        if "tp_size" in rec:
            return True            # more GPUs: checked at that TP by the search itself
        try:
            again = EngineSettings.from_settings(merged_settings(role.settings, rec), role.tp_size, where=role.file)
        except InputError:
            return False
        got = budget(capacity, facts, again, measured, measured_settings or settings, **kw)
        return got.verdict == "fits" and got.severity == "ok"

    doc = b.to_json()
    rec = dict(b.recommended)
    if rec and not passes(rec):
        alternatives = [x.settings for x in suggest(capacity, facts, settings, measured, measured_settings, **kw)]
        rec = next((alt for alt in alternatives if passes(alt)), {})
        doc["recommended"] = rec
        if not rec:
            doc["message"] = "no setting found that passes the check once merged into the role's settings"
    doc["recommended_flags"] = recommendation_flags(rec, flag)
    doc["recommended_remove"] = [flag(k) for k in removed_settings(role.settings, rec)]
    doc["recommended_settings"] = merged_settings(role.settings, rec) if rec else {}
    if flags_release and flags_release != version:
        doc["flags_release"] = flags_release
    if want_suggestions:
        doc["suggestions"] = [dict(s.to_json(), flags=recommendation_flags(s.settings, flag),
                                   remove=[flag(k) for k in removed_settings(role.settings, s.settings)])
                              for s in suggest(capacity, facts, settings, measured, measured_settings, **kw)
                              if passes(s.settings)]
    return doc


def headroom_margin(mem: Mapping[str, Any]) -> float | None:
    """The headroom's margin, where the check got that far (None: it stopped before the headroom,
    at weights that do not load or an empty KV pool, whose figure of "available" is then no margin)."""
    margin = mem.get("margin_gib")
    return float(margin) if mem.get("headroom_breakdown") and isinstance(margin, (int, float)) else None


def own_roles_folder(inv: Inventory) -> Path:
    """Where the inventory's own role files are read from: its roles_dir, else ``../roles`` beside it."""
    return Path(inv.roles_dir) if inv.roles_dir else Path(os.path.normpath(Path(inv.path).parent / ".." / "roles"))


def settings_edit(role: Role, mem: Mapping[str, Any], roles_folder: Path | None) -> str:
    """The recommendation as the edit to make: the role file's keys and values and where that file is
    (a packaged role is copied into ``roles_folder``, the inventory's own roles, first), then the
    engine flags it renders. The flags alone sent users looking for a command line that gpudeploy
    writes itself."""
    rec = mem.get("recommended") or {}
    changes = [f"settings.{k}: {json.dumps(v)}" for k, v in rec.items() if v is not None and k != "tp_size"]
    dropped = [f"settings.{k}" for k in removed_settings(role.settings, rec)]
    edits = [x for x in ("set " + ", ".join(changes) if changes else "",
                         "remove " + ", ".join(dropped) if dropped else "",
                         f"set tp_size: {rec['tp_size']} (and give it that many GPUs)" if "tp_size" in rec else "")
             if x]
    if not edits:
        return str(mem.get("message") or "none found")
    if Path(role.file).resolve().parent == PACKAGED_ROLES.resolve():
        copy = roles_folder / f"{role.file_role}.yml" if roles_folder else f"your roles_dir as {role.file_role}.yml"
        where = f"in a copy of the packaged role {role.file_role} ({role.file}) at {copy}"
    else:
        keys = [f"settings.{k}" for k in rec if k != "tp_size"] + ["settings" if changes or dropped else "tp_size"]
        line = next((role.lines[k] for k in keys if k in role.lines), None)  # the first key to edit, as written
        where = f"in {role.file}" + (f":{line}" if line else "")
    flags = " ".join(mem.get("recommended_flags") or [])
    drop = " ".join(mem.get("recommended_remove") or [])
    renders = "; ".join(x for x in (f"the engine then gets {flags}" if flags else "",
                                    f"and loses {drop}" if drop else "", str(mem.get("message") or "")) if x)
    more = f"; or give it {mem['needs_more_gpus']} GPUs" if mem.get("needs_more_gpus") and "tp_size" not in rec else ""
    return f"{where}: {'; '.join(edits)}" + (f" ({renders})" if renders else "") + more


@dataclass(frozen=True)
class MemoryVerdict:
    """What deploy does about one unit's memory, in the words deploy and plan both print."""

    severity: str  # "ok" (or nothing to check), "warn" (deploy says so and goes ahead), "refuse"
    said: str  # the verdict in a sentence: for a refusal what it is about, for a warning the margin
    fix: str  # the edit that passes the check ("" when none is needed)
    notes: tuple[str, ...] = ()  # the preflight's notes (deploy prints each as a warning)


def unit_memory_verdict(u: Unit, roles_folder: Path | None) -> MemoryVerdict:
    """The unit's memory verdict as deploy acts on it (no verdict: a unit gpudeploy does not size)."""
    mem = u.memory or {}
    verdict = mem.get("verdict")
    if verdict is None:
        return MemoryVerdict("ok", "", "")
    if verdict == "unknown":
        # deploy goes ahead (nothing is known to refuse), but a plan that checked nothing is no "OK"
        return MemoryVerdict("warn", f"memory not checked: {mem.get('reason')}; give the role model.facts "
                             "(docs/memory.md) to have it checked", "")
    notes = tuple(str(n) for n in mem.get("notes") or [])
    severity = str(mem.get("severity", "refuse" if verdict != "fits" else "ok"))
    if severity == "refuse":
        return MemoryVerdict("refuse", f"memory preflight predicts {verdict}: {mem.get('reason')}",
                             settings_edit(u.role, mem, roles_folder), notes)
    if severity == "warn":
        margin, band = float(mem.get("margin_gib", 0.0)), float(mem.get("error_band_gib", 0.0))
        what = f"{-margin:.2f} GiB short" if margin < 0 else f"{margin:.2f} GiB spare"
        assumed = mem.get("assumed") or []
        unknown = f"; it assumes {', '.join(assumed)}" if verdict == "uncertain" and assumed else ""
        return MemoryVerdict("warn", f"memory preflight: {verdict}, {what} in the headroom, within the "
                             f"estimate's +-{band:.2f} GiB error{unknown}: deploying anyway",
                             settings_edit(u.role, mem, roles_folder), notes)
    spare = headroom_margin(mem)
    said = f"memory fits: {mem.get('kv_tokens')} KV tokens" + (
        f", {spare:.2f} GiB spare headroom" if spare is not None else "")
    return MemoryVerdict("warn" if notes else "ok", said, "", notes)


def memory_verdicts(plan: Plan) -> tuple[list[Problem], list[str]]:
    """What the memory preflight says about the plan's units, for deploy.

    Returns (refusals, warnings): a refusal stops the deploy unless ``--force``; a warning is
    printed and the deploy goes ahead. Only certainties refuse (the weights do not fit, the KV
    pool, the request table or the mamba state do not fit) and a graph-capture shortfall larger
    than the whole error band; an uncertain verdict (assumed inputs make the band wide), a shortfall
    or a thin margin inside the band warns, with what is assumed, so a setup that boots is never
    refused on a guess. ``plan`` ends with the same verdicts (report.plan_recap).
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    folder = own_roles_folder(plan.inventory)
    for u in plan.units:
        v = unit_memory_verdict(u, folder)
        where = f"{u.host.name}/{u.role.name}"
        if v.severity == "refuse":
            problems.append(Problem(f"{v.said}. Fix: {v.fix} (or --force)", file=u.role.file,
                                    host=u.host.name, role=u.role.name, key="settings"))
            continue
        if v.fix:
            warnings.append(f"{where}: {v.said}. If it dies, the next plan learns from its log. Safer: {v.fix}")
        warnings.extend(f"{where}: memory preflight: {note}" for note in v.notes)
    return problems, warnings


def free_memory_problems(host: Host, units: list[Any], devices: list[dict[str, Any]],
                         processes: list[dict[str, Any]], own_pids: set[int],
                         store: CalibrationStore | None = None, roles_folder: Path | None = None) -> list[str]:
    """Deploy's second look, with NVML's reading of the host: the memory preflight again with what is
    free on each unit's GPUs right now (less what this deployment's own earlier runs hold, which a
    restart gives back) and the GPU's own kind from its name. Returns what now refuses where the plan
    did not (a display or driver holding memory NVML lists under no process, say); --force skips it."""
    real = {d["index"]: d for d in devices if "index" in d}
    out: list[str] = []
    for u in units:
        mem = u.memory or {}
        if u.role.engine != "sglang" or mem.get("verdict") in (None, "unknown") or mem.get("severity") == "refuse":
            continue
        seen = [real[g] for g in u.gpus if g in real and real[g].get("free") is not None]
        if len(seen) != len(u.gpus):
            continue

        def free_of(d: dict[str, Any]) -> float:
            mine = sum(p.get("used", 0) for p in processes if p.get("gpu") == d["index"] and p.get("pid") in own_pids)
            return float(d["free"] + mine) / 2**30

        tightest = min(seen, key=free_of)
        free = free_of(tightest)
        again = unit_memory(host, u.role, u.gpus, u.engine_version, store, [], flags_release=u.flags_release or None,
                            gpu_name=str(tightest.get("name") or "") or None, free_gib=free, argv=u.argv)
        if again and again.get("severity") == "refuse":
            out.append(f"GPU {tightest['index']} (for role {u.role.name}) has {free:.2f} GiB free by NVML; with "
                       f"that the memory preflight predicts {again['verdict']}: {again.get('reason')}. "
                       f"Fix: {settings_edit(u.role, again, roles_folder)} (or --force)")
    return out
