"""Named instances of one role file (issue 25) render for Kubernetes: one LeaderWorkerSet each, and a
router whose upstream names the role file fronts every instance, with their image and startup budget."""

from __future__ import annotations

from pathlib import Path

from k8stools import DECODE, PREFILL, ROUTER, by_kind, container, write_inventory

from gpudeploy.k8s import render


def test_a_router_in_front_of_three_instances_of_one_decode_role(tmp_path: Path) -> None:
    two = {**DECODE, "tp_size": 2, "health": {"timeout_s": 2400}}
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": [{"role": "prefill", "gpus": [0, 1]},
                                                  {"role": "decode", "name": "decode-a", "gpus": [2, 3]},
                                                  {"role": "decode", "name": "decode-b", "gpus": [4, 5]},
                                                  {"role": "decode", "name": "decode-c", "gpus": [6, 7]},
                                                  "router"]}},
        {"prefill": {**PREFILL, "tp_size": 2}, "decode": two, "router": ROUTER})
    text = render(inv).streams["t"]
    sets = by_kind(text, "LeaderWorkerSet")
    assert sorted(sets) == ["t-decode-a", "t-decode-b", "t-decode-c", "t-prefill"]
    router = by_kind(text, "Deployment")["t-router"]
    args = container(router, None)["args"]
    decodes = [args[i + 1] for i, a in enumerate(args) if a == "--decode"]
    assert decodes == [f"http://t-decode-{x}-leader:{p}" for x, p in (("a", 30010), ("b", 30020), ("c", 30030))]
    assert container(router, None)["image"] == "lmsysorg/sglang:v0.5.23"
    timeout = args[args.index("--worker-startup-timeout-secs") + 1]
    assert int(timeout) >= 2 * 2400  # the instances' startup budget (twice health.timeout_s), not a default
