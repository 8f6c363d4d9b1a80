"""status (and the watch's poll, and redeploy's check) asks an SGLang server /server_info, which every
scheduler answers in milliseconds, before /health, which generates and answers after 1 s at the
earliest (issue 26: that second was most of a status of a few hosts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpudeploy.apply.deployment import probe_spec as deploy_spec
from gpudeploy.model import Health
from gpudeploy.plan.build import load_plan
from gpudeploy.verify.liveness import live_urls
from gpudeploy.verify.status import probe_spec as status_spec

LAB = str(Path(__file__).resolve().parents[2] / "lab" / "inventory" / "lab.yml")


def test_sglang_is_asked_server_info_then_its_health_and_others_their_own_path() -> None:
    plan = load_plan(LAB)
    by_role = {u.role.name: u for u in plan.units}
    decode, router = by_role["decode"], by_role["lab-router"]
    host = decode.host
    port = decode.ports["http"]
    assert live_urls(decode, host) == [f"http://127.0.0.1:{port}/server_info", f"http://127.0.0.1:{port}/health"]
    assert live_urls(router, host) == f"http://127.0.0.1:{router.ports['http']}/readiness"
    # a health path of the role's own choosing is asked as it is
    own = replace(decode, role=replace(decode.role, health=Health(path="/health_generate")),
                  health_url=decode.health_url.replace("/health", "/health_generate"))
    assert live_urls(own, host) == f"http://127.0.0.1:{port}/health_generate"
    # both probes that decide "healthy" ask it so
    mine = [u for u in plan.units if u.host.name == host.name]
    assert status_spec(host, mine, [])["http"][decode.name] == live_urls(decode, host)
    assert deploy_spec(host, mine, mine)["http"][decode.name] == live_urls(decode, host)
