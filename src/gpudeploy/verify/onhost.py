"""HTTP made by the host itself, for hosts whose sshd refuses port forwarding.

gpudeploy's HTTP to a server normally travels inside the host's SSH connection as a direct-tcpip
channel (``ssh -L``). Rented containers and hardened hosts often have ``AllowTcpForwarding no``:
sshd then refuses every such channel ("administratively prohibited"), and a gate that took that for
"not up yet" waited out its whole timeout. There, the request runs on the host instead: a stdlib
script under the host's python makes it against the server's local address and prints the answer as
one JSON document (a streamed answer's events with their timing measured there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import GpudeployError, LockLost
from ..remote.base import Transport

# argv: MODE URL BODY_JSON TIMEOUT MAX_EVENTS MAX_BYTES; MODE get | post | delete | sse. One JSON line out:
# {"status", "body"} | {"status", "events", "first_event_s", "total_s", "cut"} | {"status": null, "error"}.
SCRIPT = r"""
import json, sys, time, urllib.error, urllib.request
mode, url, body, timeout, max_events, max_bytes = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
data = body.encode() if mode not in ("get", "delete") and body else None
req = urllib.request.Request(url, data=data, method={"get": "GET", "delete": "DELETE"}.get(mode, "POST"),
                             headers={"Content-Type": "application/json"} if data else {})
t0 = time.monotonic()
try:
    resp = opener.open(req, timeout=timeout)
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read(2000).decode(errors="replace")}))
    sys.exit(0)
except Exception as exc:
    print(json.dumps({"status": None, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
if mode != "sse":
    print(json.dumps({"status": resp.status, "body": resp.read(max_bytes).decode(errors="replace")}))
    sys.exit(0)
events, first, size, cut = [], None, 0, ""
try:
    while True:
        line = resp.readline(1 << 20)
        if not line:
            break
        text = line.decode(errors="replace").strip()
        if not text.startswith("data:"):
            continue
        item = text[5:].strip()
        if item == "[DONE]":
            break
        if first is None:
            first = time.monotonic() - t0
        size += len(item)
        if len(events) >= max_events or size > max_bytes:
            cut = f"the stream went on past {max_events} events or {max_bytes} bytes"
            break
        events.append(item)
        if time.monotonic() - t0 > timeout:
            cut = f"the stream went on past {timeout:g} s"
            break
except Exception as exc:
    cut = f"the stream broke: {type(exc).__name__}: {exc}"
print(json.dumps({"status": resp.status, "events": events, "first_event_s": first,
                  "total_s": time.monotonic() - t0, "cut": cut}))
"""


@dataclass(frozen=True)
class Answer:
    status: int | None
    body: str = ""
    events: tuple[str, ...] = ()
    first_event_s: float | None = None
    total_s: float = 0.0
    cut: str = ""
    error: str = ""


def request(via: Transport, mode: str, url: str, body: Any, timeout: float, *, max_events: int = 4096,
            max_bytes: int = 1 << 20) -> Answer:
    """Run one HTTP request on ``via``'s host; Answer(status=None, error=...) when nothing answered."""
    argv = [via.host.python or "python3", "-c", SCRIPT, mode, url, json.dumps(body) if body is not None else "",
            f"{timeout:g}", str(max_events), str(max_bytes)]
    try:
        res = via.run(argv, timeout=timeout + 15, check=False)
    except LockLost:
        raise  # nothing was run: the host is lost to this run, not silent (errors.py)
    except GpudeployError as exc:
        return Answer(None, error=str(exc))
    try:
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Answer(None, error=f"the host's python gave no answer (exit {res.rc}): {res.stderr.strip()[-300:]}")
    return Answer(doc.get("status"), str(doc.get("body", "")), tuple(str(e) for e in doc.get("events", ())),
                  doc.get("first_event_s"), float(doc.get("total_s") or 0.0), str(doc.get("cut", "")),
                  str(doc.get("error", "")))
