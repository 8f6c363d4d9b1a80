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
    (["[2026-11-29 10:00:00 TP0] Load weight begin. avail mem=139.29 GB",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 465.66 GiB. GPU 0 has a total capacity of "
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


# A CUDA OOM means what the phase says (issue 22): the field's own line, without SGLang's "Capture ...
# failed" wrapper, after the weights loaded, is never "weights do not fit".
FIELD_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a total capacity "
             "of 94.97 GiB of which 2.30 GiB is free.")
LOADED = ["[t TP0] Load weight begin. avail mem=93.52 GB",
          "[t TP0] Load weight end. elapsed=40.02 s, type=DeepseekV3ForCausalLM, avail mem=58.95 GB, "
          "mem usage=34.57 GB."]
POOL = [*LOADED, "[t TP0] KV Cache is allocated. #tokens: 480652, KV size: 31.46 GB",
        "[t TP0] Memory pool end. avail mem=26.80 GB"]
OOM_CASES = [
    ("0.5.9 capture, no wrapper", [*POOL, "[t TP0] Capture cuda graph begin. This can take up to several minutes. "
                                   "avail mem=26.50 GB", FIELD_OOM], "oom-in-graph-capture", "graph-capture:decode"),
    ("0.5.23 target verify", [*POOL, "[t TP0] Capture target verify CUDA graph begin. backend=full, "
                              "num_tokens_per_req=2, avail mem=26.50 GB",
                              f"[t TP1] Scheduler hit an exception: {FIELD_OOM}"],
     "oom-in-graph-capture", "graph-capture:verify"),
    ("0.5.23 target decode", [*POOL, "[t TP0] Capture target decode CUDA graph begin. backend=full, "
                              "num_tokens_per_req=1, avail mem=26.50 GB", FIELD_OOM], "oom-in-graph-capture",
     "graph-capture:decode"),
    ("0.5.9 draft worker, after the target's graphs",
     [*POOL, "[t TP0] Capture cuda graph begin. avail mem=26.50 GB",
      "[t TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=0.54 GB. avail mem=25.96 GB.",
      "[t TP0] Load weight begin. avail mem=25.96 GB", FIELD_OOM], "oom-in-graph-capture", "draft"),
    # sgl-project/sglang#24364 (WSL2): the mamba pool's allocation, after the weights loaded
    ("pool allocation", [*LOADED, '  File "/x/sglang/srt/mem_cache/memory_pool.py", line 499, in _init_mamba_pool',
                         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.56 GiB."],
     "memory-pool-does-not-fit", "weights-loaded"),
    ("warmup", [*POOL, "[t TP0] max_total_num_tokens=480652, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                "max_running_requests=48, context_len=163840, available_gpu_mem=2.10 GB", FIELD_OOM],
     "oom-at-warmup", "warmup"),
    ("serving", [*POOL, "[t TP0] The server is fired up and ready to roll!", FIELD_OOM], "oom-while-serving", "ready"),
    ("weights", ["[t TP0] Load weight begin. avail mem=93.52 GB", FIELD_OOM], "weights-do-not-fit", "loading-weights"),
]


@pytest.mark.parametrize(("lines", "kind", "phase"), [c[1:] for c in OOM_CASES], ids=[c[0] for c in OOM_CASES])
def test_an_oom_is_named_by_the_phase_it_came_in(lines: list[str], kind: str, phase: str) -> None:
    cause = classify(lines, {"mem_fraction_static": 0.7}, exited=True)
    assert cause is not None and (cause.kind, cause.extra.get("phase")) == (kind, phase)
    if kind != "weights-do-not-fit":
        assert "use more GPUs" not in cause.next_step
    if "Tried to allocate 7.50" in lines[-1]:
        assert "5.20 GiB short" in cause.summary and "GPU 1" in cause.summary


def test_a_hybrid_models_empty_kv_pool_names_the_mamba_strategy_not_the_fraction() -> None:
    """The field's hybrid + MTP with extra_buffer: SGLang says "increase --mem-fraction-static", the
    operator went 0.80 -> 0.90 -> 0.95, and what worked was dropping extra_buffer."""
    lines = ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
             "self.server_args.mem_fraction_static=0.95"]
    settings = {"mem_fraction_static": 0.95, "mamba_scheduler_strategy": "extra_buffer", "max_running_requests": 512,
                "speculative_algorithm": "EAGLE"}
    cause = classify(lines, settings, lambda n: flag_for("sglang", "0.5.23", n))
    assert cause is not None and cause.kind == "kv-pool-empty"
    assert "--mamba-radix-cache-strategy extra_buffer try no_buffer" in cause.next_step
    assert "--max-running-requests (now 512)" in cause.next_step
    assert not cause.next_step.startswith("raise")
    plain = classify(lines, {"mem_fraction_static": 0.84})
    assert plain is not None and plain.next_step.startswith("raise --mem-fraction-static (now 0.84)")


@pytest.mark.parametrize(("line", "phase"), [
    ("[t TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8192], avail mem=11.99 GB",
     "capturing CUDA graphs"),
    ("[t TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=10.68 GB",
     "capturing CUDA graphs"),
    ("[t TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=10.68 GB",
     "capturing CUDA graphs"),
    ("[t TP0] Capture draft extend CUDA graph begin. backend=full, avail mem=10.10 GB", "capturing CUDA graphs"),
    # an end line moves no phase: 0.5.23 captures decode graphs after the prefill ones, a draft follows
    ("[t TP0] Capture target prefill CUDA graph end. elapsed=26.10 s, mem usage=1.31 GB, avail mem=10.68 GB.", None),
    ("[t TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=0.54 GB. avail mem=16.74 GB.", None),
    ("[t TP0] max_total_num_tokens=1106304, chunked_prefill_size=8192, max_prefill_tokens=16384, "
     "max_running_requests=4096, context_len=131072, available_gpu_mem=10.16 GB", "starting HTTP server"),
])
def test_phases_of_0523_and_059_lines(line: str, phase: str | None) -> None:
    assert phase_of(line) == phase


# The real 0.5.23 CPU prefill's journal mid roll in a loaded lab run (the server lived on, /health 200,
# while the requests whose KV this thread was to send hung for minutes).
TRANSFER_THREAD_DIED = """\
[2026-12-06 00:00:32] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 4, token usage: 0.00
Exception in thread Thread-5 (transfer_worker):
Traceback (most recent call last):
  File "/opt/gpudeploy/engines/sglang/venv/lib/python3.11/site-packages/sglang/srt/disaggregation/mooncake/conn.py", \
line 2857, in transfer_worker
    or self.check_status(kv_chunk.room) == KVPoll.Success
  File "/opt/gpudeploy/engines/sglang/venv/lib/python3.11/site-packages/sglang/srt/disaggregation/common/conn.py", \
line 609, in check_status
    return self.request_status[bootstrap_room]
KeyError: 658755885904621646
During handling of the above exception, another exception occurred:
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1038, in _bootstrap_inner
    self.run()
  File "/opt/gpudeploy/engines/sglang/venv/lib/python3.11/site-packages/sglang/srt/disaggregation/mooncake/conn.py", \
line 2882, in transfer_worker
    raise RuntimeError(
RuntimeError: Transfer thread failed because of 658755885904621646. Prefill instance with bootstrap_port=8998 is dead.
[2026-12-06 00:00:33] INFO:     10.231.0.13:57752 - "POST /generate HTTP/1.1" 200 OK""".splitlines()


def test_a_prefill_whose_kv_transfer_thread_died_is_broken_though_it_lives_on() -> None:
    assert [line for line in TRANSFER_THREAD_DIED if fatal_rule(line)] == [TRANSFER_THREAD_DIED[-2]]
    cause = classify(TRANSFER_THREAD_DIED, exited=False)
    assert cause is not None and cause.kind == "kv-transfer-thread-died"
    assert "/health" in cause.summary and "hang" in cause.summary and "restart" in cause.next_step
    assert "658755885904621646" in "\n".join(cause.evidence)  # the error it died of
