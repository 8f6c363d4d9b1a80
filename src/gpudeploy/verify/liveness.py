"""Is a running engine alive now, asked fast: what status, the watch's poll and redeploy's check ask.

The gate waits for the role's health path, SGLang's ``/health``: a one-token generation that answers
after 1 s at the earliest (0.5.23 ``http_server.py`` ``health_generate``: ``await asyncio.sleep(1)``
before its first look). That second was most of a status of a few hosts (issue 26). Once a server
has passed the gate, status needs to know that its schedulers still answer, and SGLang's
``/server_info`` asks exactly that: it waits for every scheduler's (DP rank's) internal state
(``tokenizer_manager.get_internal_state``, a round trip through each scheduler's event loop) and
answers in milliseconds. A scheduler that hangs (a stuck kernel, a deadlock, SIGSTOP) answers it no
more than it answers ``/health``, so a hang is still "down".

A server without that route (an older release: 404) or that keeps it behind ``--api-key`` (401; the
health paths are exempt) is asked the role's own health path next, on the host, in the same probe
(``remote_probe.NO_SUCH_ROUTE``). A role that names its own health path gets exactly that path.

What the probe's spec needs of a health ask lives here too (how long one may take, the URL as the
host itself reaches it), without the HTTP client (``http.py``): a deploy that starts nothing never
imports that, or the gate (issue 26).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..model import Host, Unit

SGLANG_LIVE_PATH = "/server_info"

# SGLang's /health runs a one-token generation and answers only after it has waited at least 1 s
# for it, at most SGLANG_HEALTH_CHECK_TIMEOUT (20 s) before a 503 (0.5.23 http_server.py,
# health_generate: `await asyncio.sleep(1)` before its first look). A request timeout of 1 s (as
# with the stand-in, which answered at once) never saw the real server's 200.
SGLANG_HEALTH_CHECK_S = 20.0
HEALTH_MARGIN_S = 5.0


def request_timeout(unit: Unit) -> float:
    """How long one health request may take before it counts as no answer."""
    if unit.role.engine != "sglang":
        return 2.0
    try:
        own = float(unit.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", SGLANG_HEALTH_CHECK_S))
    except ValueError:
        own = SGLANG_HEALTH_CHECK_S
    return own + HEALTH_MARGIN_S


def local_url(url: str, host: Host) -> str:
    """``url`` as ``host`` itself reaches it: a server on the host's own address is asked at the
    address it listens on there (127.0.0.1 for 0.0.0.0), never at the address we reach the host by,
    which a NAT'd container often cannot reach from inside (no hairpin)."""
    parts = urlsplit(url)
    if parts.hostname != host.address:
        return url
    bind = host.bind_address
    local = "127.0.0.1" if bind in ("", "0.0.0.0") else "[::1]" if bind == "::" else (  # noqa: S104
        f"[{bind}]" if ":" in bind else bind)
    return parts._replace(netloc=f"{local}:{parts.port or 80}").geturl()


def live_urls(unit: Unit, host: Host) -> str | list[str]:
    """What the host probe asks for ``unit``'s health: its health URL as the host reaches it, or,
    for an SGLang API server with the default health path, ``/server_info`` first and that URL
    after it."""
    health = local_url(unit.health_url, host)
    follower = unit.group is not None and unit.group.rank != 0  # SGLang's dummy health server: /health only
    if unit.role.engine != "sglang" or unit.role.health.path != "/health" or follower:
        return health
    return [urlsplit(health)._replace(path=SGLANG_LIVE_PATH, query="").geturl(), health]
