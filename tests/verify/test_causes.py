"""The failure-cause table and the gate's journal filter, on recorded lines (no hosts needed)."""

from __future__ import annotations

import pytest

from gpudeploy.plan.flags import flag_for
from gpudeploy.verify.causes import classify, fatal_rule, phase_of

CASES = [
    (["[2026-11-29 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.1 GB",
      "Capture cuda graph failed: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 has a total capacity of "
      "95.00 GiB of which 2.30 GiB is free.", "Possible solutions:"], "oom-in-graph-capture"),
    (["Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 1.50 GiB."], "oom-in-graph-capture"),
    (["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], "kv-pool-empty"),
    (["RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache."],
     "mamba-state-does-not-fit"),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 465.66 GiB. GPU 0 has a total capacity of "
      "139.80 GiB of which 139.29 GiB is free."], "weights-do-not-fit"),
    (["sglang serve: error: unrecognized arguments: --cuda-graph-max-bs 16"], "unknown-flag"),
    (["OSError: [Errno 98] Address already in use"], "port-in-use"),
    (["torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
      "unhandled system error"], "nccl-error"),
    (["[2026-11-29 10:00:00] Rank 1 scheduler is dead. Please check if there are relevant logs."], "worker-died"),
    (["[2026-11-29 10:00:00 TP0] Load weight begin. avail mem=94.90 GB"], "exited-without-message"),
]


@pytest.mark.parametrize(("lines", "kind"), CASES, ids=[c[1] for c in CASES])
def test_each_failure_text_gets_its_cause(lines: list[str], kind: str) -> None:
    cause = classify(lines, exited=True)
    assert cause is not None and cause.kind == kind
    assert cause.next_step


def test_advice_uses_the_release_spelling_and_current_values() -> None:
    lines = ["Capture cuda graph failed: CUDA out of memory. Tried to allocate 7.50 GiB."]
    settings = {"mem_fraction_static": 0.85, "cuda_graph_max_bs": 64}
    new = classify(lines, settings, lambda n: flag_for("sglang", "0.5.23", n))
    old = classify(lines, settings, lambda n: flag_for("sglang", "0.5.10", n))
    assert new and "--cuda-graph-max-bs-decode (now 64)" in new.next_step
    assert "lower --mem-fraction-static (now 0.85)" in new.next_step
    assert old and "--cuda-graph-max-bs (now 64)" in old.next_step


def test_phases_follow_sglang_log_lines() -> None:
    assert phase_of("[x TP0] Load weight begin. avail mem=94.90 GB") == "loading weights"
    assert phase_of("[x TP0] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB") == \
        "allocating KV cache"
    assert phase_of("Capture cuda graph begin. This can take up to several minutes.") == "capturing CUDA graphs"
    assert phase_of("The server is fired up and ready to roll!") == "ready"




def test_nccl_warnings_are_not_fatal_but_nccl_errors_are() -> None:
    # NCCL_DEBUG=WARN (or INFO, as the NCCL advice suggests) prints WARN lines in healthy runs.
    warn = "node171:1234:1290 [0] NCCL WARN NET/IB : No device found."
    assert fatal_rule(warn) is None
    assert classify([warn, "The server is fired up and ready to roll!"], exited=False) is None
    err = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    assert (rule := fatal_rule(err)) is not None and rule.kind == "nccl-error"
