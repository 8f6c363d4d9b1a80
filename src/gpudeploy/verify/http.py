"""HTTP reads of the servers gpudeploy deployed: /health, /readiness.

These go straight to the host's own address: an ``http_proxy`` set for the operator's browser or
pip must not carry them (a proxy that cannot reach the GPU network would keep the gate from ever
seeing 200), so the opener has no proxy handler, whatever the environment says.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status_of(url: str, timeout: float) -> int | None:
    """The HTTP status ``url`` answers with, or None when nothing answers (or not in HTTP)."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
        # refused, reset, timed out, or a port that speaks something else (BadStatusLine)
        return None
