"""Ask the installed SGLang release for its own memory defaults, once per release, GPU and launch.

The memory preflight's defaults (``mem_fraction_static``, ``chunked_prefill_size``, the decode
``cuda_graph_max_bs``, ``max_running_requests``) are its reading of each captured release's rules;
the release on the host knows its own. Before deploy goes ahead, each SGLang unit that has no answer
kept here yet (``defaultscache``) has its host's probe resolve the release's ServerArgs with the
unit's own arguments and the GPU memory the inventory gives (:func:`remote_probe.release_defaults`),
and the answer is kept. A host that cannot answer (no SGLang in that python, an import error, a
release other than the inventory's) costs only the answer: the plan keeps the captured rules and
says so; deploy is never refused for it.

A model that lives only on the GPU node (no ``model.facts``, no folder here) is read there in the same
round trip: its ``config.json`` and its checkpoint's sizes from the safetensors index or headers
(:func:`remote_probe.model_files`), kept like the defaults, so the memory check has its facts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import defaultscache
from ..facts.probe import probe
from ..fanout import for_each_host, say
from ..model import Host, Plan, Unit
from ..plan.memcheck import gpu_mib
from ..remote import connect


def wanted(units: tuple[Unit, ...] | list[Unit]) -> list[Unit]:
    """The SGLang units whose release has not been asked for these arguments on this GPU."""
    out = []
    for u in units:
        if u.role.engine != "sglang" or not u.engine_version or not u.gpus or not u.argv:
            continue
        if any(g not in u.host.gpu_memory_gib for g in u.gpus) or not on_cuda(u.argv):
            continue
        if defaultscache.unanswered("defaults", u.host.name, [u.argv[0], u.engine_version]):
            continue
        if defaultscache.lookup("sglang", u.engine_version, gpu_mib(u.host, u.gpus),
                                defaultscache.launch_args(u.argv)) is None:
            out.append(u)
    return out


def last_line(error: object) -> str:
    """What a host's failed answer says, as one line: a python traceback's last line (the exception),
    never the traceback itself, which a user would read as gpudeploy's own crash."""
    text = str(error).strip()
    head = text.split(":", 1)[0] if text.startswith("exit ") else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else text
    return (f"{head}: {last}" if head and not last.startswith(head) else last)[-200:]


def on_cuda(argv: tuple[str, ...] | list[str]) -> bool:
    """The release's memory defaults are those of a CUDA GPU: a server told ``--device cpu`` (the lab's
    real SGLang) has none to give, and asking it would cost an import of the release for nothing."""
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1] in ("cuda", "gpu")
        if a.startswith("--device="):
            return a.split("=", 1)[1] in ("cuda", "gpu")
    return True


def model_unread(u: Unit) -> str | None:
    """The model folder of an SGLang unit whose facts are nowhere here: no ``model.facts``, no
    config.json at ``model.path`` on this machine, nothing read on its host yet."""
    path = u.role.model.get("path")
    if u.role.engine != "sglang" or not path or isinstance(u.role.model.get("facts"), dict):
        return None
    if (Path(str(path)) / "config.json").is_file() or defaultscache.lookup_model(u.host.name, str(path)) \
            or defaultscache.unanswered("model", u.host.name, [str(path)]):
        return None
    return str(path)


def ask(plan: Plan) -> list[str]:
    """Ask each unit's release that has no answer kept, and read the model folders that live only on
    their host; return what was learned (one line each), and say what could not be. Never raises for
    a host's answer."""
    todo = wanted(plan.units)
    folders = {(u.host.name, p) for u in plan.units if (p := model_unread(u))}
    hosts = {u.host.name: u.host for u in plan.units if u in todo or (u.host.name, model_unread(u)) in folders}

    def one(host: Host) -> list[str]:
        # one ask per launch: replicas of a role on other GPUs of the host get the same answer (each
        # ask imports the release: ~11 s of CPU)
        launches: dict[tuple[str, float, tuple[str, ...]], Unit] = {}
        for u in todo:
            if u.host.name == host.name:
                launches.setdefault((u.argv[0], gpu_mib(u.host, u.gpus), tuple(defaultscache.launch_args(u.argv))), u)
        mine = [(u, mib, list(args)) for (_, mib, args), u in launches.items()]
        asks = [{"python": u.argv[0], "gpu_mib": mib, "args": args, "gpus": ",".join(str(g) for g in u.gpus)}
                for u, mib, args in mine]
        paths = sorted(p for h, p in folders if h == host.name)
        with connect(host) as remote:
            facts = probe(remote, {"defaults": asks, "models": paths}, timeout=240)
        learned = _models(host, paths, facts.get("models"))
        answers: list[Any] = list(facts.get("defaults") or [])[:len(mine)]
        for (u, mib, args), answer in zip(mine, answers + [{}] * (len(mine) - len(answers)), strict=True):
            if not isinstance(answer, dict) or "error" in answer or not answer:
                why = last_line(answer.get("error") if isinstance(answer, dict) else answer)
                defaultscache.save_no_answer("defaults", host.name, [u.argv[0], str(u.engine_version)], str(why))
                say(f"[{host.name}] could not ask sglang {u.engine_version} for its memory defaults ({u.role.name}): "
                    f"{why}; the plan keeps {u.engine_version}'s captured rules (not asked again there "
                    "for a day)")
                continue
            try:
                got = defaultscache.save("sglang", str(u.engine_version), mib, args, answer, host.name)
            except ValueError as exc:
                say(f"[{host.name}] sglang {u.engine_version}'s memory defaults for {u.role.name} not kept: {exc}")
                continue
            shown = ", ".join(f"{k} {v}" for k, v in got.values)
            say(f"[{host.name}] asked sglang {u.engine_version} for its memory defaults ({u.role.name}): {shown}")
            learned.append(f"{host.name}/{u.role.name}")
        return learned

    out: list[str] = []
    for name, res in for_each_host(list(hosts.values()), one).items():
        if isinstance(res, Exception):
            say(f"[{name}] could not ask its sglang release for its memory defaults: {res}")
            continue
        out += res
    return out


def _models(host: Host, paths: list[str], answers: Any) -> list[str]:
    learned = []
    answers = answers if isinstance(answers, dict) else {}
    for path in paths:
        got = answers.get(path) or {"error": "no answer"}
        try:
            if "error" in got:
                defaultscache.save_no_answer("model", host.name, [path], str(got["error"]))
                raise ValueError(last_line(got["error"]))
            kept = defaultscache.save_model(host.name, path, got)
        except (ValueError, AttributeError, TypeError) as exc:
            say(f"[{host.name}] could not read the model at {path} there ({exc}); its memory check stays unknown")
            continue
        say(f"[{host.name}] read the model at {path} there: {kept.total_bytes / 2**30:.2f} GiB of weights "
            f"({kept.source})")
        learned.append(f"{host.name}:{path}")
    return learned
