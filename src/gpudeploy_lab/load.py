"""A bounded load generator for the lab: a fixed number of clients sending generations through a
router, each request kept with its start, end and answer, until told to stop (or a hard limit).

For the rolling-update test and benchmark: which requests failed, and their latency before, during
and after an update window. SGLang's own bench_serving reports one total per run and no per-request
times, so it cannot say which requests fell inside the window.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # lab traffic only, never a proxy


@dataclass(frozen=True)
class Sent:
    start: float  # time.monotonic()
    end: float
    status: int  # HTTP status; 0 when nothing answered
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def latency_s(self) -> float:
        return self.end - self.start


@dataclass
class Load:
    url: str  # the router's /generate
    clients: int = 2
    max_new_tokens: int = 8
    limit_s: float = 900.0  # ends by itself after this, whatever happens
    timeout_s: float = 60.0
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        deadline = time.monotonic() + self.limit_s
        for i in range(self.clients):
            t = threading.Thread(target=self._client, args=(i, deadline), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def _client(self, index: int, deadline: float) -> None:
        n = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            body = json.dumps({"text": f"the gpu server {index} {n}", "sampling_params": {
                "max_new_tokens": self.max_new_tokens, "temperature": 0}}).encode()
            req = urllib.request.Request(self.url, data=body,  # noqa: S310 - http://, the lab's router
                                         headers={"Content-Type": "application/json"})
            t0 = time.monotonic()
            status, error = 0, ""
            try:
                with OPENER.open(req, timeout=self.timeout_s) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status, error = exc.code, exc.read(300).decode(errors="replace")
            except (urllib.error.URLError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.sent.append(Sent(t0, time.monotonic(), status, error))
            n += 1

    def window(self, start: float, end: float) -> tuple[list[Sent], list[Sent], list[Sent]]:
        """The requests sent before ``start``, while the window was open, and after ``end``."""
        with self._lock:
            sent = list(self.sent)
        return ([s for s in sent if s.end < start], [s for s in sent if s.end >= start and s.start <= end],
                [s for s in sent if s.start > end])


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
