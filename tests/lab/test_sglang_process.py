"""The real SGLang 0.5.23 under gpudeploy's process supervisor, on lab9: a host without systemd,
like a rented GPU container (marked ``sglang``). The same deploy, gate, death cause and clean
teardown as under systemd."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Lab, no_systemd_host
from deploytools import Deployments, gd, status_json, wait_for
from test_sglang import real_role

pytestmark = [pytest.mark.lab, pytest.mark.sglang]

HOST = "lab9"


@pytest.fixture(scope="module")
def bare_host(lab: Lab) -> Iterator[str]:
    yield from no_systemd_host(lab, HOST)


def _alive(lab: Lab, pids: list[int]) -> list[int]:
    return [p for p in pids if lab.ssh(HOST, f"test -e /proc/{p} && ! grep -q '^State:.*Z' /proc/{p}/status")
            .returncode == 0]


def test_the_real_engine_under_the_process_supervisor(bare_host: str, deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("preal", {"srv": real_role()}, host=bare_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "lab9/srv: started in" in out and "KV tokens 4096" in out, out  # the figures the engine logged
    [unit] = status_json(inv)["hosts"][HOST]["units"]
    assert unit["healthy"] and unit["health"] == "200", unit
    pids = unit["pids"]
    assert len(pids) >= 3, unit  # the server, its scheduler and detokenizer (and a resource tracker)
    scheduler = next(p for p in pids if lab.ssh(HOST, f"cat /proc/{p}/comm").stdout.startswith("sglang::schedul"))
    lab.ssh(HOST, f"kill -9 {scheduler}", check=True)
    failed = wait_for(lambda: next((u for u in status_json(inv)["hosts"][HOST]["units"]
                                    if u["state"].startswith("failed")), None), 90, "the death to show")
    assert (failed["last_failure"] or "").startswith("a TP worker (scheduler) process died"), failed
    down = gd("teardown", "--inventory", str(inv))
    assert down.returncode == 0 and "clean: no process left" in down.stdout, down.stdout
    assert _alive(lab, pids) == []
