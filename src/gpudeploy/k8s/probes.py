"""Probes: how long a pod may take to start, and how long a health check may take.

**Startup**: overrunning the startup probe kills the container and, with
``RecreateGroupOnPodRestart``, recreates the whole group, which then starts as slowly again: a
budget equal to the role's ``health.timeout_s`` (what deploy waits before it calls a start failed)
turns one slow load into a loop. A pod gets twice that, and an hour at least (llm-d's SGLang pods:
30 s x 120; the issue's references allow 1-2 h), probed every 10 s so it is Ready soon after it
serves.

**Readiness**: SGLang's ``/health`` runs a one-token generation (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``,
on by default) and answers 503 itself once ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) passes without
an answer from the scheduler (``srt/entrypoints/http_server.py``): a probe that gives up sooner
fails a server that is only busy. The probe waits that long and 5 s more.

A router's start is its own process only (``/liveness`` answers at once); its ``/readiness``
answers from what it knows.
"""

from __future__ import annotations

import math
from typing import Any

from ..model import Role

PERIOD_S = 10
MIN_STARTUP_S = 3600
HEALTH_CHECK_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
SGLANG_HEALTH_CHECK_TIMEOUT_S = 20
MARGIN_S = 5
ROUTER_TIMEOUT_S = 5
READY_FAILURES = 3


def startup_budget_s(role: Role) -> int:
    """Seconds an engine pod may take to serve before the kubelet restarts it."""
    budget = max(2 * role.health.timeout_s, MIN_STARTUP_S)
    return math.ceil(budget / PERIOD_S) * PERIOD_S


def engine_probes(role: Role, env: dict[str, str]) -> dict[str, Any]:
    """An engine rank's probes, on the role's health path at its http port."""
    check = {"httpGet": {"path": role.health.path, "port": "http"}}
    try:
        server_s = int(float(env.get(HEALTH_CHECK_TIMEOUT_ENV, SGLANG_HEALTH_CHECK_TIMEOUT_S)))
    except ValueError:
        server_s = SGLANG_HEALTH_CHECK_TIMEOUT_S
    timeout = max(server_s, 0) + MARGIN_S
    return {
        "startupProbe": {**check, "periodSeconds": PERIOD_S, "timeoutSeconds": timeout,
                         "failureThreshold": startup_budget_s(role) // PERIOD_S},
        "readinessProbe": {**check, "periodSeconds": PERIOD_S, "timeoutSeconds": timeout,
                           "failureThreshold": READY_FAILURES},
    }


def router_probes(role: Role) -> dict[str, Any]:
    """/liveness answers once the router serves; /readiness (the role's path) once its workers are
    healthy, which takes as long as the engines' load: readiness waits, nothing restarts."""
    return {
        "startupProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": PERIOD_S,
                         "timeoutSeconds": ROUTER_TIMEOUT_S,
                         "failureThreshold": max(1, math.ceil(role.health.timeout_s / PERIOD_S))},
        "readinessProbe": {"httpGet": {"path": role.health.path, "port": "http"}, "periodSeconds": PERIOD_S,
                           "timeoutSeconds": ROUTER_TIMEOUT_S, "failureThreshold": READY_FAILURES},
    }
