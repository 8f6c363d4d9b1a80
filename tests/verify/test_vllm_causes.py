"""vLLM's failure-cause and phase table (log_format: vllm), on vLLM's real texts (no hosts needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy.inventory import load_role
from gpudeploy.verify.causes import VLLM, classify, log_format, phase_of

REPO = Path(__file__).resolve().parents[2]
CORE = "(EngineCore pid=1116) "
DIED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"

CASES = [
    ([f"{CORE}ValueError: Available memory on node 0 (20.31/23.47 GiB) on kv cache allocation is less than "
      "requested memory for kv (4096.00 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or "
      "reduce CPU memory used by other processes.", DIED], "kv-cache-too-large"),
    ([f"{CORE}ValueError: To serve at least one request with the model's max seq len (2048), (0.02 GiB KV cache "
      "is needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, "
      "the estimated maximum model length is 1024.", DIED], "kv-cache-too-small"),
    (["api_server.py: error: unrecognized arguments: --no-such-flag"], "unknown-flag"),
    (["api_server.py: error: argument --max-model-len: invalid human_readable_int value: 'x'"], "unknown-flag"),
    (["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
      "  Value error, User-specified max_model_len (4096) is greater than the derived max_model_len "
      "(max_position_embeddings=2048.0 in model's config.json)."], "max-model-len-too-long"),
    (["ValueError: Invalid repository ID or local directory specified: '/models/nope'."], "model-not-found"),
    (["OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 18000): address already in use"],
     "port-in-use"),
    ([f"{CORE}ERROR Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.", DIED],
     "engine-core-died"),
    (["(APIServer pid=983) INFO Starting to load model /models/tiny..."], "exited-without-message"),
]


@pytest.mark.parametrize(("lines", "kind"), CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(CASES)])
def test_each_vllm_failure_text_gets_its_cause(lines: list[str], kind: str) -> None:
    cause = classify(lines, {"kv_cache_memory_bytes": "4T", "max_model_len": 4096}, exited=True, fmt=VLLM)
    assert cause is not None and cause.kind == kind, cause
    assert cause.next_step


def test_advice_names_the_flag_and_the_value_in_use() -> None:
    cause = classify(CASES[0][0], {"kv_cache_memory_bytes": "4T"}, fmt=VLLM)
    assert cause and "lower --kv-cache-memory-bytes (now 4T)" in cause.next_step


def test_vllm_phases() -> None:
    assert phase_of("(EngineCore pid=1) INFO Starting to load model /m...", VLLM) == "loading weights"
    assert phase_of("(EngineCore pid=1) INFO Model loading took 0.0 GiB memory and 0.1 seconds", VLLM) == \
        "allocating KV cache"
    assert phase_of("(EngineCore pid=1) INFO init engine (profile, create kv cache, warmup model) took 1.2 s",
                    VLLM) == "starting HTTP server"
    assert phase_of("(APIServer pid=1) INFO:     Application startup complete.", VLLM) == "ready"
    assert phase_of("The server is fired up and ready to roll!", VLLM) is None  # SGLang's words


def test_role_log_format_selects_the_table() -> None:
    role = load_role(REPO / "lab" / "roles" / "vllm-tiny.yml", [])
    assert role is not None and role.log_format == "vllm" and log_format(role.log_format) is VLLM
    assert log_format(None).name == "sglang"
