"""Kubernetes names and labels of a deployment's roles, and the names Kubernetes would refuse.

Inventory names may hold ``_`` and end in ``-``; object names may not. ``<deployment>-<role>``
with ``_`` turned into ``-`` names a role's objects; what is still no DNS-1035 label, or too long,
is a problem (renaming is the user's call, not ours).
"""

from __future__ import annotations

import re

# Service names are DNS-1035 labels; the other kinds accept them too.
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
MAX_NAME = 63
# A StatefulSet's pods carry ``controller-revision-hash: <statefulset>-<hash of up to 10>``, a label
# value of at most 63: a StatefulSet name longer than 52 never gets pods (kubernetes#64023). LWS
# names its leader StatefulSet ``<lws>`` and each group's workers ``<lws>-<group index>``.
MAX_STATEFULSET = 52

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


def base(deployment: str, role: str) -> str:
    return f"{deployment}-{role}".replace("_", "-")


def engine(deployment: str, role: str) -> str:
    """The LeaderWorkerSet (and the headless Service LWS makes for it, named the same)."""
    return base(deployment, role)


def leader_service(deployment: str, role: str) -> str:
    """The Service in front of the group leaders (LWS's own headless Service has the LWS's name)."""
    return base(deployment, role) + "-leader"


def router(deployment: str, role: str) -> str:
    """The router's Deployment and its Service."""
    return base(deployment, role)


def env_config(deployment: str, role: str) -> str:
    return base(deployment, role) + "-env"


def secret(deployment: str) -> str:
    """One Secret per deployment holds every secret its roles name (HF_TOKEN once, not per role)."""
    return f"{deployment}-secrets".replace("_", "-")


def labels(deployment: str, role: str, app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/instance": deployment,
            "app.kubernetes.io/component": role, "app.kubernetes.io/managed-by": "gpudeploy"}


def selector(deployment: str, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": deployment, "app.kubernetes.io/component": role}


def name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME or not DNS_LABEL.fullmatch(name):
        return (f"the Kubernetes name {name!r} is not a DNS-1035 label (lowercase letters, digits and '-', "
                f"starting with a letter, ending with a letter or digit, at most {MAX_NAME} characters)")
    return None


def subdomain_problem(name: str) -> str | None:
    """Why ``name`` cannot name a PersistentVolumeClaim (a DNS-1123 subdomain), or None."""
    if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        return (f"{name!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', starting and "
                "ending with a letter or digit, at most 253 characters)")
    return None


def label_problem(value: str) -> str | None:
    if len(value) > MAX_NAME or not LABEL_VALUE.fullmatch(value):
        return (f"{value!r} cannot be a Kubernetes label value (letters, digits, '-', '_' and '.', "
                f"starting and ending with a letter or digit, at most {MAX_NAME} characters)")
    return None


def statefulset_problem(lws: str, replicas: int) -> str | None:
    longest = f"{lws}-{max(replicas - 1, 0)}"
    if len(longest) > MAX_STATEFULSET:
        return (f"LeaderWorkerSet {lws!r} names its StatefulSets up to {longest!r} ({len(longest)} characters); "
                f"Kubernetes creates no pods for a StatefulSet name over {MAX_STATEFULSET} "
                "(its controller-revision-hash label would pass 63)")
    return None
