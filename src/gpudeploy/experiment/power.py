"""Power, SM utilisation and memory of the engines' GPUs while one benchmark run measures (the field
read these off nvidia-smi by hand: "drawing only ~400 W of its 600 W").

For the length of the client's run, each engine host runs ``SAMPLER`` over its own SSH channel: NVML
read every ``EVERY_S`` for the deployment's GPUs there, one JSON line per sample. It is tied to the
run and leaves nothing behind: it exits when its stdin closes (the run is over and gpudeploy closes
the channel, or the connection dropped), when gpudeploy's heartbeat stops for ``BEAT_S`` (sshd may
take hours to notice a client that vanished), and at the latest when ``timeout`` ends it, the
client's own time limit plus a margin. A host without NVML says so once and samples nothing.

The figures (:func:`figures`) are of the samples inside the client's measured span (its ``duration``,
up to when the client ended), so warmup and the client's own start-up are not averaged in: the mean
draw of all the deployment's GPUs together (the sum of each GPU's mean), the mean SM utilisation, and
the peak memory in use; output tok/s per watt divides the run's output tok/s by that draw.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError
from ..model import Host, Plan
from ..remote import connect
from ..remote.jsonlines import json_lines

EVERY_S = 0.5
BEAT_S = 10.0
HEARTBEAT_EVERY_S = 1.0
MARGIN_S = 60.0  # beyond the client's own limit, the sampler's ``timeout``

# Runs on an engine host: argv GPUS(comma list) EVERY_S BEAT_S. Stdout: {"ready", "standin"} once (or
# {"error"}), then {"t", "gpus": {index: [watts, sm %, bytes used]}} per sample.
SAMPLER = r"""
import json, os, select, sys, time
gpus = [int(x) for x in sys.argv[1].split(",")]
every, beat = float(sys.argv[2]), float(sys.argv[3])
def say(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
try:
    try:
        import pynvml
        pynvml.nvmlInit()
        handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in gpus}
    except Exception as exc:
        say({"error": "NVML: %s" % (exc,)})
        sys.exit(0)
    standin = getattr(pynvml, "STANDIN", None)
    say({"ready": True, "standin": str(standin) if standin else None})
    def read(fn, h):
        try:
            return fn(h)
        except Exception:
            return None
    heard = time.monotonic()
    while True:
        started = time.monotonic()
        sample = {}
        for g, h in handles.items():
            p = read(pynvml.nvmlDeviceGetPowerUsage, h)
            u = read(pynvml.nvmlDeviceGetUtilizationRates, h)
            m = read(pynvml.nvmlDeviceGetMemoryInfo, h)
            sample[str(g)] = [p / 1000.0 if p is not None else None, getattr(u, "gpu", None), getattr(m, "used", None)]
        say({"t": time.time(), "gpus": sample})
        while True:
            left = started + every - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([0], [], [], left)
            if ready:
                if not os.read(0, 4096):
                    sys.exit(0)
                heard = time.monotonic()
        if time.monotonic() - heard > beat:
            sys.exit(0)
except (BrokenPipeError, KeyboardInterrupt):
    sys.exit(0)
"""


def sampler_argv(python: str, gpus: list[int], limit_s: float) -> list[str]:
    return ["timeout", "-k", "5", f"{limit_s:g}", python, "-c", SAMPLER, ",".join(map(str, gpus)),
            f"{EVERY_S:g}", f"{BEAT_S:g}"]


@dataclass
class HostSamples:
    """What one engine host's sampler said: (when it arrived here, GPU -> [W, SM %, bytes])."""

    host: str
    gpus: list[int]
    samples: list[tuple[float, dict[str, list[Any]]]] = field(default_factory=list)
    standin: str | None = None
    error: str | None = None


def engine_gpus(plan: Plan) -> dict[str, tuple[Host, list[int]]]:
    """host -> (the host, its GPUs that the deployment's engines run on)."""
    out: dict[str, tuple[Host, list[int]]] = {}
    for u in plan.units:
        if u.gpus and u.role.engine != "sglang_router":
            gpus = out.setdefault(u.host.name, (u.host, []))[1]
            gpus += [g for g in u.gpus if g not in gpus]
    return out


class Sampling:
    """The samplers of one benchmark run: started before the client, stopped when it has ended."""

    def __init__(self, plan: Plan, limit_s: float, opener: Callable[[Host], Any] | None = None) -> None:
        self.limit_s = limit_s + MARGIN_S
        self.opener = opener or connect
        self.done = threading.Event()
        self.hosts = {name: HostSamples(name, sorted(gpus)) for name, (_, gpus) in engine_gpus(plan).items()}
        self.threads = [threading.Thread(target=self._sample, args=(host, self.hosts[name]), daemon=True,
                                         name=f"power-{name}") for name, (host, _) in engine_gpus(plan).items()]

    def __enter__(self) -> Sampling:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> dict[str, HostSamples]:
        """End every sampler (its channel closes: it exits) and return what they said."""
        self.done.set()
        for t in self.threads:
            t.join(10)
        return self.hosts

    def _sample(self, host: Host, out: HostSamples) -> None:
        try:
            with self.opener(host) as remote:
                chan = remote.stream(sampler_argv(host.python or "python3", out.gpus, self.limit_s))
                try:
                    beat = 0.0
                    for doc in json_lines(chan, self.done):
                        now = time.time()
                        if not isinstance(doc, dict):
                            continue
                        if "error" in doc:
                            out.error = str(doc["error"])
                        elif doc.get("ready"):
                            out.standin = doc.get("standin")
                        elif isinstance(doc.get("gpus"), dict):
                            out.samples.append((now, doc["gpus"]))
                        if time.monotonic() - beat >= HEARTBEAT_EVERY_S:
                            chan.sendall(b".")
                            beat = time.monotonic()
                finally:
                    chan.close()  # its stdin closes: the sampler exits
        except (GpudeployError, OSError) as exc:
            out.error = out.error or f"no samples: {exc}"


def figures(hosts: dict[str, HostSamples], start: float, end: float) -> dict[str, Any]:
    """The run's power figures from the samples inside [start, end] (all of them if fewer than two
    fall inside): mean_power_w (the GPUs' mean draws, summed), mean_sm_util_pct, peak_gpu_mem_gib,
    power_samples, power_standin (a stand-in NVML modelled them), power_error. Pure."""
    if not hosts:
        return {}
    draws: list[float] = []
    sm: list[float] = []
    peak = 0
    count = 0
    errors = [f"{h.host}: {h.error}" for h in hosts.values() if h.error]
    complete = True
    for h in hosts.values():
        inside = [s for t, s in h.samples if start <= t <= end]
        chosen = inside if len(inside) >= 2 else [s for _, s in h.samples]
        count += len(chosen)
        for g in h.gpus:
            watts = [float(s[str(g)][0]) for s in chosen if _number(s.get(str(g)), 0)]
            utils = [float(s[str(g)][1]) for s in chosen if _number(s.get(str(g)), 1)]
            used = [int(s[str(g)][2]) for s in chosen if _number(s.get(str(g)), 2)]
            if watts:
                draws.append(statistics.fmean(watts))
            else:
                complete = False
            if utils:
                sm.append(statistics.fmean(utils))
            peak = max([peak, *used])
    return {"mean_power_w": round(sum(draws), 1) if draws and complete else None,
            "mean_sm_util_pct": round(statistics.fmean(sm), 1) if sm else None,
            "peak_gpu_mem_gib": round(peak / 2**30, 2) if peak else None,
            "power_samples": count, "power_standin": any(h.standin for h in hosts.values()),
            "power_error": "; ".join(errors) or None}


def _number(row: Any, i: int) -> bool:
    return isinstance(row, list) and len(row) > i and isinstance(row[i], (int, float)) and not isinstance(row[i], bool)


def per_watt(output_tok_s: float | None, power_w: float | None) -> float | None:
    return round(output_tok_s / power_w, 3) if output_tok_s is not None and power_w else None
