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
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..model import Host, Unit
from .http import local_url

SGLANG_LIVE_PATH = "/server_info"


def live_urls(unit: Unit, host: Host) -> str | list[str]:
    """What the host probe asks for ``unit``'s health: its health URL as the host reaches it, or,
    for an SGLang API server with the default health path, ``/server_info`` first and that URL
    after it."""
    health = local_url(unit.health_url, host)
    follower = unit.group is not None and unit.group.rank != 0  # SGLang's dummy health server: /health only
    if unit.role.engine != "sglang" or unit.role.health.path != "/health" or follower:
        return health
    return [urlsplit(health)._replace(path=SGLANG_LIVE_PATH, query="").geturl(), health]
