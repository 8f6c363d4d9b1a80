"""A PD deployment's final gate: one real generation through its router, which must return text.

Every ``/health`` being 200 proves nothing about the pair: SGLang's own warmup in PD mode uses a
fake bootstrap host, so the prefill -> decode KV transfer is first exercised by a real request
(shared/reference/sglang.md). The request is streamed, so the time to the first token is measured
apart from the total; it travels through the router host's SSH connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LockLost
from ..model import Smoke, Unit
from ..remote.base import Transport
from .http import stream_events


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    endpoint: str
    text: str
    ttft_s: float | None
    total_s: float
    message: str  # why it failed, or ""


def model_name(router: Unit, upstreams: list[Unit]) -> str:
    """The model name OpenAI-style endpoints need: the role's, else the engines' served name."""
    smoke = router.role.smoke or Smoke()
    if smoke.model:
        return smoke.model
    for u in upstreams:
        name = u.role.settings.get("served_model_name") or u.role.model.get("path")
        if name:
            return str(name)
    return "default"


def request_body(smoke: Smoke, model: str) -> dict[str, Any]:
    if smoke.endpoint == "/generate":
        return {"text": smoke.prompt, "stream": True,
                "sampling_params": {"max_new_tokens": smoke.max_tokens, "temperature": 0}}
    if smoke.endpoint == "/v1/chat/completions":
        return {"model": model, "messages": [{"role": "user", "content": smoke.prompt}],
                "max_tokens": smoke.max_tokens, "temperature": 0, "stream": True}
    return {"model": model, "prompt": smoke.prompt, "max_tokens": smoke.max_tokens, "temperature": 0,
            "stream": True}


def text_of(endpoint: str, events: list[Any]) -> str:
    """The generated text from the streamed events (SGLang's /generate repeats the whole text so
    far in each event; OpenAI endpoints send pieces)."""
    dicts = [e for e in events if isinstance(e, dict)]
    if endpoint == "/generate":
        return str(dicts[-1].get("text", "")) if dicts else ""
    pieces = []
    for e in dicts:
        for choice in e.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            pieces.append(str(choice.get("text") or delta.get("content") or ""))
    return "".join(pieces)


def smoke_test(router: Unit, upstreams: list[Unit], via: Transport | None) -> SmokeResult:
    smoke = router.role.smoke or Smoke()
    url = f"http://{router.host.address}:{router.ports['http']}{smoke.endpoint}"
    body = request_body(smoke, model_name(router, upstreams))
    try:
        got = stream_events(url, body, timeout=smoke.timeout_s, via=via)
    except LockLost:
        raise  # nothing was sent: the router's host is lost to this run (its deploy fails it)
    except Exception as exc:  # refused, reset, timed out, lost host: all mean no text came back
        return SmokeResult(False, smoke.endpoint, "", None, 0.0, f"no answer: {type(exc).__name__}: {exc}")
    if got.status != 200:
        return SmokeResult(False, smoke.endpoint, "", None, got.total_s,
                           f"HTTP {got.status}: {got.error_body.strip()[:300]}")
    text = text_of(smoke.endpoint, got.events)
    if got.cut:
        return SmokeResult(False, smoke.endpoint, text[:200], got.first_event_s, got.total_s,
                           f"{got.cut} (a generation of {smoke.max_tokens} tokens ends well before): is this "
                           "port an engine's?")
    if not text.strip():
        return SmokeResult(False, smoke.endpoint, text, got.first_event_s, got.total_s,
                           f"the answer had no text ({len(got.events)} events)")
    return SmokeResult(True, smoke.endpoint, text, got.first_event_s, got.total_s, "")
