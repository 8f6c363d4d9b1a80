"""Deploy's host probe in two stages: first what says whether anything must change, then, only when
something will start, what a start must have (issue 26).

A redeploy where nothing changed starts nothing, so what guards a start (free GPUs, free ports, the
engines' releases: preflight.py) has nothing to guard. Those facts are most of the probe's cost: a
python started to read the releases (~50 ms on a lab host), NVML's import and a read per GPU
(14-18 ms plus ~12 ms per GPU on an H100 node), the host's sockets. So the lock's holder answers
first with the units' states, their files' hashes, their health and whether the host reaches its
peers, and keeps the rest of the spec (``later``). Deploy asks for it through the same channel
(lock.HostLock.more: one more line, no new connection) as soon as any unit on any host is not
unchanged, active and healthy, and then checks every host exactly as before. The first stage alone
decides one thing only: that nothing starts anywhere.

Reach stays in the first stage: a decode that can no longer reach its prefill is a broken pair
even when nothing changed, and a redeploy says so, as before (a connect per peer costs little).
The trade-off, chosen: a redeploy that changes nothing no longer says that an engine's installed
release has drifted from the one its flags were checked for, or that a process of no unit took
memory on a running unit's GPU. The next deploy that starts that unit does; ``invoke facts`` shows
the releases and the GPUs' processes.
"""

from __future__ import annotations

from typing import Any

# spec key -> the key of its answer in the probe's facts (remote_probe.main)
SECOND = {"ports": "listening", "gpus": "gpus", "versions": "versions", "topology": "topology"}
# Read again in the second stage: preflight tells a unit's own processes from others' on its GPUs and
# ports, so it needs them as of the same moment (an engine still starting forks workers meanwhile).
AGAIN = ("units", "deployments", "journal_lines")
AGAIN_ANSWERS = ("units", "process_units")


def staged(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec the holder runs first; the rest goes with it as ``later``."""
    first = {k: v for k, v in spec.items() if k not in SECOND}
    later = second_spec(spec)
    if any(k in later for k in SECOND):
        first["later"] = later
    return first


def second_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """What the second stage reads (also for a probe of its own where the holder could not answer)."""
    return {k: v for k, v in spec.items() if k in SECOND or k in AGAIN}


def first_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """The first stage's facts without the empty answers it gave for what it did not read, so
    nothing mistakes "not read" for "none there"."""
    return {k: v for k, v in facts.items() if k not in SECOND.values()}


def complete(facts: dict[str, Any]) -> bool:
    return all(key in facts for key in SECOND.values())


def merged(facts: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """The first stage's facts with the second's: its answers, and the units as it found them."""
    return {**facts, **{key: more.get(key) for key in SECOND.values()},
            **{key: more[key] for key in AGAIN_ANSWERS if key in more}}
