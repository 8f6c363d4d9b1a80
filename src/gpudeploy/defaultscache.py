"""What hosts told about their engines and models, kept on this machine: the memory defaults installed
SGLang releases gave, and the config.json and checkpoint sizes of models that live only on a host.

    $GPUDEPLOY_DEFAULTS_CACHE (default ~/.cache/gpudeploy/defaults)/
        <program>/<release>.<key>.json   {"program", "release", "gpu_mib", "args", "defaults", "host", "when"}
        models/<key>.json                {"host", "path", "config", "checkpoint", "when"}

``key`` is the digest of the GPU memory (MiB, as the release reads it from nvidia-smi) and the launch
arguments the release resolved (less the ones that only say where it listens): the defaults are a
function of the release, the GPU's memory and the arguments (the chunk and graph cap by GPU memory
and TP, the fraction from those, speculative decoding, DP attention, the model's own config). Like
``flagcache``, an answer is kept only under the release the host's engine reported, and says which
host gave it and when, so ``plan`` offline can say where its defaults came from
(:mod:`gpudeploy.memory.asked`); without an entry it uses the captured rules and says that instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .memory import checkpoint as ck
from .memory.asked import AskedDefaults, checked_values
from .versions import same_release

ROOT = Path(os.environ.get("GPUDEPLOY_DEFAULTS_CACHE", Path.home() / ".cache" / "gpudeploy" / "defaults"))
# where the server listens and how it meets its peers: no default depends on them
WHERE_FLAGS = frozenset({"--host", "--port", "--nccl-port", "--dist-init-addr", "--node-rank",
                         "--disaggregation-bootstrap-port"})


def launch_args(argv: Sequence[str]) -> list[str]:
    """The arguments after ``python -m sglang.launch_server`` (or ``sglang serve``), less WHERE_FLAGS
    and their values."""
    args = list(argv)
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            args = args[i + 2:]
            break
        if a == "serve" and i > 0:
            args = args[i + 1:]
            break
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in WHERE_FLAGS:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def key_of(gpu_mib: float, args: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps([round(float(gpu_mib), 1), list(args)]).encode()).hexdigest()[:20]


def _safe(release: str) -> str:
    ok = all(c.isalnum() or c in ".+_-" for c in release) and release[:1].isalnum() and len(release) <= 64
    return release if ok else "r" + hashlib.sha256(release.encode()).hexdigest()[:16]


def _path(program: str, release: str, gpu_mib: float, args: Sequence[str]) -> Path:
    return ROOT / program / f"{_safe(release)}.{key_of(gpu_mib, args)}.json"


def save(program: str, release: str, gpu_mib: float, args: Sequence[str], answer: Mapping[str, Any],
         host: str) -> AskedDefaults:
    """Keep ``answer`` (the probe's, :func:`gpudeploy.facts.remote_probe.release_defaults`) for
    ``release`` on a GPU of ``gpu_mib``; ValueError when it is another release's or not numbers."""
    told = answer.get("release")
    if not isinstance(told, str) or not same_release(told, release):
        raise ValueError(f"the engine there reports {program} {told!r}, not {release}")
    values = checked_values(answer)
    doc = {"program": program, "release": release, "gpu_mib": round(float(gpu_mib), 1), "args": list(args),
           "defaults": dict(values), "host": host, "when": datetime.now(UTC).isoformat(timespec="seconds")}
    path = _path(program, release, gpu_mib, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return _asked(doc, path)


def lookup(program: str, release: str, gpu_mib: float, args: Sequence[str]) -> AskedDefaults | None:
    """The release's answer for these arguments on this GPU, if one was kept (and is still sound)."""
    path = _path(program, release, gpu_mib, args)
    try:
        doc = json.loads(path.read_text())
        if doc.get("release") != release or doc.get("args") != list(args):
            return None
        checked_values(doc.get("defaults") or {})
        return _asked(doc, path)
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _asked(doc: Mapping[str, Any], path: Path) -> AskedDefaults:
    try:
        when = datetime.fromisoformat(str(doc["when"])).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (KeyError, ValueError):
        when = str(doc.get("when"))
    source = (f"asked of {doc['program']} {doc['release']} on {doc['host']} on {when} for a GPU of "
              f"{doc['gpu_mib']:g} MiB ({path})")
    return AskedDefaults(str(doc["release"]), source, checked_values(doc["defaults"]))


# ---- hosts that could not answer ------------------------------------------------------------------
# A host whose python cannot answer (no SGLang there, an import error, a stand-in) is not asked again
# for a day: each ask is a connection and a probe before deploy goes ahead, and a redeploy must not
# pay it every time (issue 44 asked for answers "cached", and a missing answer is an answer too).
NO_ANSWER_FOR = timedelta(days=1)


def _no_answer_path(kind: str, host: str, what: Sequence[str]) -> Path:
    digest = hashlib.sha256(json.dumps([kind, host, list(what)]).encode()).hexdigest()[:20]
    return ROOT / "unanswered" / f"{digest}.json"


def save_no_answer(kind: str, host: str, what: Sequence[str], why: str) -> None:
    """Keep that ``host`` could not answer ``kind`` (``defaults`` for a python and release, ``model``
    for a folder) so that it is not asked again within NO_ANSWER_FOR."""
    path = _no_answer_path(kind, host, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"kind": kind, "host": host, "what": list(what), "why": why[-300:],
                               "when": datetime.now(UTC).isoformat(timespec="seconds")}) + "\n")
    tmp.replace(path)


def unanswered(kind: str, host: str, what: Sequence[str]) -> bool:
    """True while ``host`` said within NO_ANSWER_FOR that it cannot answer ``kind`` for ``what``."""
    try:
        doc = json.loads(_no_answer_path(kind, host, what).read_text())
        return bool(datetime.now(UTC) - datetime.fromisoformat(str(doc["when"])) < NO_ANSWER_FOR)
    except (OSError, ValueError, KeyError, TypeError):
        return False


# ---- model folders that live only on a host --------------------------------------------------------

def _model_path(host: str, path: str) -> Path:
    return ROOT / "models" / f"{hashlib.sha256(json.dumps([host, path]).encode()).hexdigest()[:20]}.json"


def save_model(host: str, path: str, answer: Mapping[str, Any]) -> ck.Checkpoint:
    """Keep what the probe read of ``path`` on ``host`` (:func:`remote_probe.model_files`); ValueError
    when it is not a config.json object and checked checkpoint sizes."""
    config = answer.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"no config.json object for {path} (got {type(config).__name__})")
    try:
        got = ck.from_json(answer.get("checkpoint"), f"{host}:{path}")
    except ck.CheckpointError as exc:
        raise ValueError(exc.message) from None
    doc = {"host": host, "path": path, "config": config, "checkpoint": ck.to_json(got),
           "when": datetime.now(UTC).isoformat(timespec="seconds")}
    out = _model_path(host, path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    return got


def lookup_model(host: str, path: str) -> tuple[dict[str, Any], ck.Checkpoint] | None:
    """(config.json, the checkpoint's sizes, its source naming the host) of ``path`` on ``host``."""
    try:
        doc = json.loads(_model_path(host, path).read_text())
        if doc.get("host") != host or doc.get("path") != path or not isinstance(doc.get("config"), dict):
            return None
        got = ck.from_json(doc.get("checkpoint"), f"{host}:{path}")
    except (OSError, ValueError, AttributeError, TypeError, ck.CheckpointError):
        return None
    return doc["config"], ck.Checkpoint(got.total_bytes, f"{got.source}, read on {host} on {doc.get('when')}",
                                        got.draft_bytes, got.attention_bytes, got.by_dtype)
