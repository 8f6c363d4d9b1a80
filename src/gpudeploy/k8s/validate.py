"""Offline validation of rendered manifests: what an API server would refuse, without one.

**LeaderWorkerSet**: the ``openAPIV3Schema`` of its CRD (kubernetes-sigs/lws at 060ab4d,
``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``, controller-gen v0.17.2,
Apache-2.0); ``data/leaderworkerset-v1.schema.json`` is that schema with its descriptions removed
(``lws_schema_from_crd``; tests/k8s checks it against ``shared/reference/k8s/``). Checked with
jsonschema Draft 7 after the changes that make it answer as the API server would:
``x-kubernetes-int-or-string`` becomes ``anyOf`` integer/string; an object with ``properties`` but
no ``additionalProperties`` refuses unknown fields (the server's strict field validation); the
CRD's top-level ``metadata`` (just ``type: object`` there) is checked as the ObjectMeta it is.

**Core kinds** (Deployment, Service, ConfigMap, ...): the strict schemas of Kubernetes
``K8S_VERSION`` that kubernetes-validate bundles, checked with jsonschema Draft 2020-12 as
kubernetes-validate does, but reporting every error instead of the first.

In both, an integer whose format is int32 or int64 must fit it (the server decodes it into a Go
integer and refuses what does not fit). Schemas are loaded once per process.

Not covered: the LWS webhook's defaulting and validation, admission policies, anything a cluster
decides (which images, resources and CRDs it has).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from ..errors import GpudeployError, Problem
from .roleset import Manifest

K8S_VERSION = "1.30"  # the Kubernetes whose core schemas a render is checked against
LWS_SCHEMA = "leaderworkerset-v1.schema.json"
LWS_SOURCE = ("LeaderWorkerSet v1 openAPIV3Schema, descriptions removed: kubernetes-sigs/lws 060ab4d "
              "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml (controller-gen v0.17.2, "
              "Apache-2.0)")
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
MAX_ERRORS = 10  # per manifest: the first ten say what is wrong


class ValidationUnavailable(GpudeployError):
    """The schemas to check against are not installed: render refuses to write unchecked files."""


def lws_schema_from_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """The CRD's v1 ``openAPIV3Schema`` without descriptions (what ``data/`` ships)."""
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strip(version["schema"]["openAPIV3Schema"])
    return {"$comment": LWS_SOURCE, **schema}


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def strict_crd_schema(node: Any) -> Any:
    """A CRD schema as jsonschema should read it to refuse what the API server refuses."""
    if isinstance(node, list):
        return [strict_crd_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_crd_schema(v) for k, v in node.items()}
    if out.get("x-kubernetes-int-or-string") is True:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, bits in (("int32", 32), ("int64", 64)):
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

        def fits(value: object, low: int = low, high: int = high) -> bool:
            return not isinstance(value, int) or isinstance(value, bool) or low <= value <= high

        checker.checks(name)(fits)
    return checker


@functools.cache
def _lws_validator() -> jsonschema.Draft7Validator:
    text = resources.files("gpudeploy").joinpath("data", LWS_SCHEMA).read_text()
    schema = strict_crd_schema(json.loads(text))
    return jsonschema.Draft7Validator(schema, format_checker=_format_checker())


def _core_dir() -> Any:
    try:
        root = resources.files("kubernetes_validate")
    except ModuleNotFoundError:
        raise ValidationUnavailable(
            "kubernetes-validate is not installed, so the manifests cannot be checked and nothing was written: "
            "pip install 'gpudeploy[k8s]' (bash scripts/setup.sh installs it)") from None
    return root.joinpath("kubernetes-json-schema", f"v{K8S_VERSION}.0-local-strict")


@functools.cache
def _core_registry() -> Any:
    from referencing import Registry, Resource

    defs = json.loads(_core_dir().joinpath("_definitions.json").read_text())
    return Registry().with_resource(defs["$id"], Resource.from_contents(defs))


@functools.cache
def _core_validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    # kubernetes-validate's file names: apps/v1 Deployment -> deployment-apps-v1.json, v1 -> configmap-v1.json
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _core_dir().joinpath(f"{kind.lower()}-{group}.json")
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_core_registry(), format_checker=_format_checker())


@functools.cache
def _meta_validator() -> jsonschema.Draft202012Validator:
    ref = {"$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{OBJECT_META}"}
    return jsonschema.Draft202012Validator(ref, registry=_core_registry(), format_checker=_format_checker())


def manifest_problems(m: Manifest, doc: dict[str, Any] | None = None) -> list[Problem]:
    """Every schema error of one manifest (``doc``: the manifest as read back from its YAML)."""
    doc = m.doc if doc is None else doc
    errors: list[tuple[str, ValidationError]] = []
    if doc.get("kind") == "LeaderWorkerSet":
        errors += [("LeaderWorkerSet v1 CRD", e) for e in _lws_validator().iter_errors(doc)]
        meta = doc.get("metadata")
        if isinstance(meta, dict):
            errors += [(f"Kubernetes {K8S_VERSION} ObjectMeta", _under("metadata", e))
                       for e in _meta_validator().iter_errors(meta)]
    else:
        validator = _core_validator(str(doc.get("kind")), str(doc.get("apiVersion")))
        if validator is None:
            return [_problem(m, f"no schema for {doc.get('apiVersion')} {doc.get('kind')} in Kubernetes "
                                f"{K8S_VERSION}: it cannot be checked, so it is not written")]
        errors += [(f"Kubernetes {K8S_VERSION} {m.kind}", e) for e in validator.iter_errors(doc)]
    errors.sort(key=lambda item: [str(p) for p in item[1].absolute_path])
    out = [_problem(m, f"{_where(e)}: {_message(e)} (fails the {schema} schema at "
                       f"{'/'.join(str(p) for p in e.absolute_schema_path)})", _source(e))
           for schema, e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        out.append(_problem(m, f"and {len(errors) - MAX_ERRORS} more schema errors"))
    return out


# Where a value of a manifest came from in the role file, for the error's key and line.
SOURCES = (("startupProbe.failureThreshold", "health.timeout_s"), ("terminationGracePeriodSeconds", "stop_timeout_s"),
           ("containerPort", "ports"), ("spec.affinity", "kubernetes.affinity"),
           ("spec.nodeSelector", "kubernetes.node_selector"), ("spec.tolerations", "kubernetes.tolerations"))


def _source(e: ValidationError) -> str | None:
    where = _where(e)
    return next((key for part, key in SOURCES if part in where), None)


def _message(e: ValidationError) -> str:
    if e.validator == "format" and e.validator_value in ("int32", "int64"):
        bits = int(str(e.validator_value)[3:])
        return f"{e.instance!r} does not fit an {e.validator_value} (at most {2 ** (bits - 1) - 1})"
    return e.message


def _under(key: str, e: ValidationError) -> ValidationError:
    e.path.appendleft(key)
    return e


def _where(e: ValidationError) -> str:
    where = ""
    for p in e.absolute_path:
        where += f"[{p}]" if isinstance(p, int) else f".{p}" if where else str(p)
    return where or "(the document)"


def _problem(m: Manifest, message: str, key: str | None = None) -> Problem:
    """At the role file's key, or for a kubernetes: setting where it was given (role or inventory)."""
    where = m.sources.get(key.split(".", 1)[1]) if key and key.startswith("kubernetes.") else None
    line = m.role.lines.get(key, m.role.lines.get(key.split(".")[0])) if key else None
    return Problem(f"the rendered {m.kind} {m.name} of deployment {m.deployment}: {message}",
                   file=where.file if where else m.role.file, line=where.line if where else line,
                   role=m.role.name, key=key)
