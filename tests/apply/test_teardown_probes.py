"""Teardown's proof reads each host once after the stop when nothing survived it (a second probe at
once cost every host ~90 ms of its CPU), and keeps reading while a killed survivor lingers."""

from __future__ import annotations

import json
from typing import Any

from gpudeploy.apply import teardown as t
from gpudeploy.remote.base import Result
from gpudeploy.supervisor import systemd

UNIT = "gpudeploy-x.srv.service"


class _Host:
    """Answers the host probe from a list of process lists (one per probe), and the exact kill."""

    def __init__(self, procs_per_probe: list[list[dict[str, Any]]]) -> None:
        self.host = type("H", (), {"name": "lab1", "python": "python3"})()
        self.procs = procs_per_probe
        self.probes = 0
        self.kills = 0

    def run(self, argv: list[str], **kw: Any) -> Result:
        if argv[1:2] == ["-c"] and "units" in argv[-1]:
            procs = self.procs[min(self.probes, len(self.procs) - 1)]
            self.probes += 1
            return Result(0, json.dumps({"units": {UNIT: {"props": {"ActiveState": "inactive", "LoadState": "loaded"},
                                                          "procs": procs}},
                                         "gpus": {"devices": [], "processes": []}}), "")
        self.kills += 1
        return Result(0, "".join(f"killed {p['pid']}\n" for p in self.procs[0]), "")


def before() -> dict[str, Any]:
    return systemd.SYSTEMD.states({"units": {UNIT: {"props": {"ActiveState": "active", "LoadState": "loaded"},
                                                    "meta": {"role": "srv"}}}})


def test_nothing_survived_the_stop_one_probe_proves_it() -> None:
    host = _Host([[]])
    [out] = t.prove_clean(host, systemd.SYSTEMD, host.host, before(), {}, purge=False)  # type: ignore[arg-type]
    assert out.clean and host.probes == 1 and host.kills == 0


def test_a_survivor_is_killed_and_read_again_until_it_is_gone() -> None:
    survivor = [{"pid": 4242, "start_ticks": 7, "cmd": "python3 -m sglang.launch_server"}]
    host = _Host([survivor, survivor, []])
    [out] = t.prove_clean(host, systemd.SYSTEMD, host.host, before(), {}, purge=False)  # type: ignore[arg-type]
    assert out.killed == [4242] and out.clean and host.probes == 3 and host.kills == 1
