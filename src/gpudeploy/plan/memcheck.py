"""The memory preflight of one SGLang unit, as plan data: verdict, numbers, recommended flags.

Model facts come from ``model.facts`` in the role (explicit numbers, for models that live only on
the GPU node) or from the model directory when it is readable here. Without either, the verdict is
``unknown`` and deploy says so rather than guessing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InputError, Problem
from ..memory import EngineSettings, budget, recommendation_flags, suggest
from ..memory.modelfacts import ModelFacts, model_facts_from_dir, model_facts_from_mapping
from ..model import Host, Plan, Role
from .calibrate import CalibrationStore
from .flags import flag_for

# The inventory gives a GPU's memory as NVML reports it; CUDA programs see about 0.6 GiB less
# (H200: NVML 140.4 GiB, torch "total capacity of 139.80 GiB"; a 96 GB card: 95.6 vs 95.0).
CUDA_RESERVED_GIB = 0.6
DEFAULT_STORE = Path(os.environ.get("GPUDEPLOY_CALIBRATION",
                                    Path.home() / ".local/state/gpudeploy/calibration.json"))


def model_facts(role: Role, problems: list[Problem]) -> ModelFacts | None:
    facts = role.model.get("facts")
    path = role.model.get("path")
    try:
        if isinstance(facts, dict):
            return model_facts_from_mapping(facts, where=role.file)
        if path and (Path(str(path)) / "config.json").is_file():
            return model_facts_from_dir(str(path))
    except InputError as exc:
        problems.extend(Problem(p.message, file=p.file or role.file, line=role.lines.get("model"), role=role.name,
                                key=f"model.facts.{p.key}" if p.key and isinstance(facts, dict) else p.key)
                        for p in exc.problems)
    return None


def unit_memory(host: Host, role: Role, gpus: tuple[int, ...], version: str, store: CalibrationStore | None,
                problems: list[Problem], *, want_suggestions: bool = False) -> dict[str, Any] | None:
    if role.engine != "sglang" or not gpus:
        return None
    facts = model_facts(role, problems)
    if facts is None:
        return {"verdict": "unknown", "recommended": {},
                "reason": "no model facts: the model dir is not readable here and the role has no model.facts"}
    try:
        settings = EngineSettings.from_settings(role.settings, role.tp_size, where=role.file)
    except InputError as exc:
        problems.extend(exc.problems)
        return None
    capacity = min(host.gpu_memory_gib.get(g, 0.0) for g in gpus) - CUDA_RESERVED_GIB
    model_id = str(role.model.get("path", role.name))
    measured = store.get(host.name, model_id, role.settings) if store else None
    measured_settings = None
    if measured is None and store is not None:
        # a run under other settings (the failed one, before its recommendation was applied)
        found = store.latest(host.name, model_id)
        if found is not None:
            try:
                measured_settings = EngineSettings.from_settings(found[0], role.tp_size)
                measured = found[1]
            except InputError:
                measured_settings = None
    b = budget(capacity, facts, settings, measured, measured_settings, release=version)
    doc = b.to_json()

    def flag(name: str) -> str:
        return flag_for("sglang", version, name)

    doc["recommended_flags"] = recommendation_flags(b.recommended, flag)
    if want_suggestions:
        doc["suggestions"] = [dict(s.to_json(), flags=recommendation_flags(s.settings, flag))
                              for s in suggest(capacity, facts, settings, measured, measured_settings,
                                               release=version)]
    return doc


def memory_verdicts(plan: Plan) -> tuple[list[Problem], list[str]]:
    """What the memory preflight says about the plan's units, for deploy.

    Returns (refusals, warnings): a refusal stops the deploy unless ``--force``; a warning is
    printed and the deploy goes ahead. Only certainties refuse (the weights do not fit, the KV
    pool or the mamba state comes out empty) and a graph-capture shortfall larger than the
    estimate's measured error; a shortfall or a thin margin inside that error warns, with the
    margin, so a setup that boots is never refused on a guess.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    for u in plan.units:
        mem = u.memory or {}
        verdict = mem.get("verdict")
        if verdict in (None, "unknown"):
            continue
        rec = " ".join(mem.get("recommended_flags") or []) or mem.get("message") or "none found"
        more = f"; or use {mem['needs_more_gpus']} GPUs" if mem.get("needs_more_gpus") else ""
        severity = mem.get("severity", "refuse" if verdict != "fits" else "ok")
        if severity == "refuse":
            problems.append(Problem(f"memory preflight predicts {verdict}: {mem.get('reason')}. "
                                    f"Recommended: {rec}{more} (or --force)", file=u.role.file,
                                    host=u.host.name, role=u.role.name, key="settings"))
            continue
        where = f"{u.host.name}/{u.role.name}"
        if severity == "warn":
            margin, band = mem.get("margin_gib", 0.0), mem.get("error_band_gib", 0.0)
            what = (f"{-margin:.2f} GiB short" if margin < 0 else f"{margin:.2f} GiB spare")
            warnings.append(f"{where}: memory preflight: {verdict}, {what} in the headroom, within the "
                            f"estimate's +-{band:.2f} GiB error: deploying anyway. If it dies in CUDA graph "
                            f"capture, the next plan learns from its log. Safer: {rec}{more}")
        warnings.extend(f"{where}: memory preflight: {note}" for note in mem.get("notes") or [])
    return problems, warnings
