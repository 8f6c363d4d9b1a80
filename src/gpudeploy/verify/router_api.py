"""The real sglang-router's worker API (0.3.2, "sgl-model-gateway"), and an engine's own load.

Read off the real router in the lab (2026-12-01), not guessed:

  * ``GET /workers`` -> ``{"workers": [{"id", "url", "worker_type": prefill|decode|regular,
    "is_healthy", "load", "bootstrap_port"?, ...}], "total", "stats"}``;
  * ``POST /workers {"url", "worker_type", "bootstrap_port"?}`` -> 202 ``{"worker_id", "location"}``:
    the addition is a background job (``GET /workers/<id>`` shows ``job_status``) that lists the worker
    once it answers its health check;
  * ``DELETE /workers/<id>`` -> 202: the removal is queued too; new requests stop going there.

An engine's in-flight work is its own ``/v1/loads`` (SGLang 0.5.23: ``loads[].num_running_reqs`` and
``num_waiting_reqs`` per DP rank); older releases had ``/get_load`` (``num_reqs``, ``num_waiting_reqs``).
Every request travels through the SSH connection of the host it is made from (``via``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..model import Unit
from ..remote.base import Transport
from .http import request

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    kind: str  # prefill | decode | regular
    healthy: bool


def _url(router: Unit, path: str) -> str:
    return f"http://{router.host.address}:{router.ports['http']}{path}"


def workers(router: Unit, via: Transport) -> list[Worker] | None:
    """The router's workers now; None when it does not answer."""
    got = request(_url(router, "/workers"), timeout=TIMEOUT_S, via=via)
    if got is None or got.status != 200:
        return None
    try:
        doc: Any = got.json()
    except ValueError:
        return None
    items = doc.get("workers", []) if isinstance(doc, dict) else doc
    return [Worker(str(w.get("id", "")), str(w.get("url", "")), str(w.get("worker_type", "")),
                   bool(w.get("is_healthy"))) for w in items if isinstance(w, dict)]


def add(router: Unit, via: Transport, url: str, kind: str, bootstrap_port: int | None) -> str:
    """Ask the router to add ``url`` as a ``kind`` worker; the job's worker id ("" when refused)."""
    body: dict[str, Any] = {"url": url, "worker_type": kind}
    if bootstrap_port is not None:
        body["bootstrap_port"] = bootstrap_port
    got = request(_url(router, "/workers"), timeout=TIMEOUT_S, via=via, body=body)
    if got is None or got.status not in (200, 201, 202):
        return ""
    try:
        return str(got.json().get("worker_id", ""))
    except (ValueError, AttributeError):
        return ""


def remove(router: Unit, via: Transport, worker_id: str) -> bool:
    got = request(_url(router, f"/workers/{worker_id}"), timeout=TIMEOUT_S, via=via, method="DELETE")
    return got is not None and got.status in (200, 202, 204)


def wait_listed(router: Unit, via: Transport, url: str, *, healthy: bool, timeout_s: float,
                every_s: float = 0.5) -> Worker | None:
    """Until ``url`` is among the router's workers (and healthy, if asked); None at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = next((w for w in workers(router, via) or [] if w.url == url), None)
        if found is not None and (found.healthy or not healthy):
            return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(every_s)  # the poll's pause; the deadline above bounds the wait


def wait_gone(router: Unit, via: Transport, url: str, *, timeout_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        listed = workers(router, via)
        if listed is not None and not any(w.url == url for w in listed):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)


def take_out(router: Unit, via: Transport, url: str, *, timeout_s: float = 30.0, every_s: float = 0.5) -> str:
    """Take ``url`` out of the router and wait until the router no longer lists it: "" once it is out
    (or was never listed), else why not. Only then may the engine behind it stop: a timeout, a 5xx or
    a refused DELETE leaves the router sending to it."""
    deadline = time.monotonic() + timeout_s
    while (listed := workers(router, via)) is None:
        if time.monotonic() >= deadline:
            return f"the router did not answer GET /workers within {timeout_s:g} s"
        time.sleep(every_s)  # the poll's pause; the deadline above bounds the wait
    found = next((w for w in listed if w.url == url), None)
    if found is None:
        return ""
    if not remove(router, via, found.id):
        return f"the router did not accept DELETE /workers/{found.id} for {url}"
    if not wait_gone(router, via, url, timeout_s=timeout_s, every_s=every_s):
        return f"the router still lists {url} {timeout_s:g} s after its DELETE"
    return ""


def in_flight(engine: Unit, via: Transport) -> int | None:
    """The engine's running + waiting requests, from its own load endpoint; None if it cannot tell."""
    base = f"http://{engine.host.address}:{engine.ports['http']}"
    got = request(f"{base}/v1/loads", timeout=TIMEOUT_S, via=via)
    try:
        if got is not None and got.status == 200:
            loads = got.json().get("loads", [])
            return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)
        got = request(f"{base}/get_load", timeout=TIMEOUT_S, via=via)
        if got is not None and got.status == 200:
            doc = got.json()
            ranks = doc if isinstance(doc, list) else [doc]
            return sum(int(x.get("num_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in ranks)
    except (ValueError, AttributeError, TypeError):
        return None
    return None


def drain(engine: Unit, via: Transport, *, timeout_s: float, every_s: float = 0.5) -> tuple[bool, float]:
    """Until the engine has no request in flight: (drained, seconds it took); bounded by ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        left = in_flight(engine, via)
        if left == 0:
            return True, time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            return False, time.monotonic() - t0
        time.sleep(every_s)
