"""Every ``$(VAR)`` in a container's command and args must be defined for that container.

Kubernetes expands ``$(VAR)`` in ``command`` and ``args`` from the container's environment and
leaves a reference it cannot resolve as it is (``$$`` stands for ``$``): the server would get the
text ``$(LWS_WORKER_INDEX)`` for ``--node-rank``, and no schema sees that. Defined for a container
are its ``env`` names, the keys of a ConfigMap it reads whole (``envFrom``) when that ConfigMap is
in the same rendered stream, and, in a LeaderWorkerSet's pods, what the LWS webhook injects at the
oldest release the notes ask for (``lws.INJECTED``). Anything else is an error naming the
manifest, the pod template and the container.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import Problem
from . import lws
from .roleset import Manifest


def references(word: str) -> list[str]:
    """The names ``word`` refers to, as Kubernetes' expansion reads it (``$$`` is an escaped ``$``,
    a ``$(`` without its ``)`` is plain text)."""
    out: list[str] = []
    i = 0
    while i < len(word) - 1:
        if word[i] == "$" and word[i + 1] == "$":
            i += 2
        elif word[i] == "$" and word[i + 1] == "(" and (end := word.find(")", i + 2)) != -1:
            out.append(word[i + 2:end])
            i = end + 1
        else:
            i += 1
    return out


def undefined_references(manifests: list[Manifest], docs: list[dict[str, Any]]) -> list[Problem]:
    """Every reference of every container of one deployment's stream (``docs``: the manifests as
    read back from their YAML) that the container does not define."""
    config_maps = {d["metadata"]["name"]: set(d.get("data") or {}) for d in docs if d.get("kind") == "ConfigMap"}
    problems: list[Problem] = []
    for m, doc in zip(manifests, docs, strict=True):
        injected = set(lws.INJECTED) if doc.get("kind") == "LeaderWorkerSet" else set()
        for template, container in _containers(doc):
            defined = injected | {e["name"] for e in container.get("env") or [] if "name" in e}
            sources = ["its env"]
            for source in container.get("envFrom") or []:
                ref = (source.get("configMapRef") or {}).get("name")
                if ref in config_maps:
                    defined |= {f"{source.get('prefix', '')}{k}" for k in config_maps[ref]}
                    sources.append(f"ConfigMap {ref}")
            if injected:
                sources.append(f"what LWS {lws.MIN_VERSION} injects ({', '.join(lws.INJECTED)})")
            for field in ("command", "args"):
                words = container.get(field) or []
                missing = sorted({name for w in words for name in references(str(w))} - defined)
                problems += [Problem(
                    f"the rendered {m.kind} {m.name} of deployment {m.deployment}, container {container.get('name')} "
                    f"({template}): its {field} use $({name}), which is not defined for that container "
                    f"({', '.join(sources)}); Kubernetes would pass the text $({name}) to the server unchanged",
                    file=m.role.file, role=m.role.name) for name in missing]
    return problems


def _containers(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(pod template, container) for every container of a Deployment's or LeaderWorkerSet's pods."""
    spec = doc.get("spec") or {}
    templates: list[tuple[str, Any]] = [("template", spec.get("template"))]
    group = spec.get("leaderWorkerTemplate") or {}
    templates += [(name, group.get(name)) for name in ("leaderTemplate", "workerTemplate")]
    for name, template in templates:
        pod = (template or {}).get("spec") or {}
        for kind in ("initContainers", "containers"):
            for c in pod.get(kind) or []:
                yield name, c
