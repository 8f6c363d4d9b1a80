"""Model facts from config.json fixtures, explicit numbers, and the errors for bad facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeploy.errors import InputError
from gpudeploy.memory.modelfacts import model_facts_from_dir, model_facts_from_mapping

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("fixture", "kind", "per_token"), [
    ("llama-3.1-8b", "mha", 131072),
    ("llama-3.1-70b", "mha", 327680),
    ("qwen3-32b", "mha", 262144),
    ("deepseek-v3", "mla", 70272),
    ("qwen3-next-80b-a3b", "hybrid", 24576),
])
def test_kv_bytes_per_token_table(fixture: str, kind: str, per_token: int) -> None:
    m = model_facts_from_dir(FIX / fixture)
    assert m.kind == kind
    assert m.kv_bytes_per_token(1) == per_token


def test_mla_kv_not_divided_by_tp() -> None:
    m = model_facts_from_dir(FIX / "deepseek-v3")
    assert {m.kv_bytes_per_token(tp) for tp in (1, 2, 4, 8, 16)} == {70272}
    assert m.quantization == "fp8"
    assert m.mtp_layers == 1
    assert m.draft_bytes() == m.weight_bytes - m.target_weight_bytes() > 0


def test_gqa_kv_split_by_tp_but_at_least_one_head() -> None:
    m = model_facts_from_dir(FIX / "llama-3.1-70b")
    assert m.kv_bytes_per_token(8) == 327680 // 8
    assert m.kv_bytes_per_token(16) == 327680 // 8     # 8 KV heads: replicated beyond TP8
    assert m.kv_bytes_per_token(1, kv_dtype_bytes=1) == 327680 // 2


def test_hybrid_layout_and_state() -> None:
    m = model_facts_from_dir(FIX / "qwen3-next-80b-a3b")
    assert (m.full_attention_layers, m.linear_layers) == (12, 36)
    # per linear layer: ssm 32*128*128*4 + conv (2*16*128 + 32*128)*3*2
    assert m.state_bytes_per_request(1) == 36 * (2097152 + 49152)
    assert m.state_bytes_per_request(2) == 36 * (2097152 + 49152) // 2


def test_sharded_and_single_file_weights() -> None:
    assert model_facts_from_dir(FIX / "llama-3.1-8b").weight_bytes == 16060522496
    tiny = model_facts_from_dir(FIX / "tiny-single-file")
    assert tiny.weight_bytes == 4096
    assert tiny.head_dim == 64 and tiny.kv_heads == 2


def test_mapping_example_from_issue() -> None:
    m = model_facts_from_mapping({"weights_gib": 146, "kv_bytes_per_token": 70272, "kind": "mla"}, "roles/x.yaml")
    assert m.kv_bytes_per_token(4) == 70272
    assert m.weight_bytes == 146 * 2**30


def _write(tmp: Path, cfg: object, index: object | str | None = None) -> Path:
    (tmp / "config.json").write_text(json.dumps(cfg))
    if isinstance(index, str):
        (tmp / "model.safetensors.index.json").write_text(index)
    elif index is not None:
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp


GOOD = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_size": 256, "vocab_size": 1000}


def _err(exc: pytest.ExceptionInfo[InputError]) -> tuple[str, str | None, str | None]:
    p = exc.value.problems[0]
    return p.message, p.file, p.key


def test_missing_config_field(tmp_path: Path) -> None:
    cfg = {k: v for k, v in GOOD.items() if k != "num_hidden_layers"}
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, cfg, {"metadata": {"total_size": 10}}))
    _msg, file, key = _err(e)
    assert key == "num_hidden_layers" and file is not None and file.endswith("config.json")
    assert "num_hidden_layers" in str(e.value)


def test_unreadable_index(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, GOOD, "{not json"))
    msg, file, _ = _err(e)
    assert file is not None and file.endswith("model.safetensors.index.json") and "JSON" in msg


def test_index_without_total_size(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, GOOD, {"weight_map": {}}))
    assert _err(e)[2] == "metadata.total_size"


def test_negative_total_size(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, GOOD, {"metadata": {"total_size": -5}}))
    assert _err(e)[2] == "total_size" and "non-negative" in _err(e)[0]


def test_no_weights_and_no_config(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, GOOD))
    assert "model.safetensors" in _err(e)[0]
    with pytest.raises(InputError) as e:
        model_facts_from_dir(tmp_path / "nowhere")
    assert "not found" in _err(e)[0]


def test_hybrid_config_missing_linear_fields(tmp_path: Path) -> None:
    cfg = {**GOOD, "num_hidden_layers": 8, "full_attention_interval": 4}
    with pytest.raises(InputError) as e:
        model_facts_from_dir(_write(tmp_path, cfg, {"metadata": {"total_size": 10}}))
    assert _err(e)[2] == "linear_num_key_heads"


@pytest.mark.parametrize(("facts", "key"), [
    ({"weights_gib": -1, "kv_bytes_per_token": 10}, "weights_gib"),
    ({"weights_gib": 10, "kv_bytes_per_token": -10}, "kv_bytes_per_token"),
    ({"weights_gib": "lots", "kv_bytes_per_token": 10}, "weights_gib"),
    ({"kv_bytes_per_token": 10}, "weights_gib"),
    ({"weights_gib": 10, "kind": "rnn", "kv_bytes_per_token": 10}, "kind"),
    ({"weights_gib": 10, "kind": "hybrid", "kv_bytes_per_token": 10}, "state_bytes_per_request"),
    ({"weights_gib": 10, "layers": 4}, "kv_heads"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "weights": 3}, "weights"),
    # a number no model has: before, a ZeroDivisionError or OverflowError in the budget, or accepted
    ({"weights_gib": 1e308, "kv_bytes_per_token": 10}, "weights_gib"),
    ({"weights_gib": float("inf"), "kv_bytes_per_token": 10}, "weights_gib"),   # refused before too: the
    ({"weights_gib": float("nan"), "kv_bytes_per_token": 10}, "weights_gib"),   # rewritten check still must
    ({"weights_gib": 0, "kv_bytes_per_token": 10}, "weights_gib"),
    ({"weights_bytes": 10**400, "kv_bytes_per_token": 10}, "weights_bytes"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "context_length": 0}, "context_length"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "context_length": 2**40}, "context_length"),
    ({"weights_gib": 10, "kv_bytes_per_token": 0}, "kv_bytes_per_token"),
    ({"weights_gib": 10, "layers": 0, "kv_heads": 8, "head_dim": 128}, "layers"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "hidden_size": 0}, "hidden_size"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "dtype_bytes": 16}, "dtype_bytes"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "activation_kib_per_token": 1e300}, "activation_kib_per_token"),
    ({"weights_gib": 10, "kind": "hybrid", "kv_bytes_per_token": 10, "state_bytes_per_request": 0},
     "state_bytes_per_request"),
    ({"weights_gib": 10, "kv_bytes_per_token": 10, "mtp_layers": 10**12}, "mtp_layers"),
])
def test_bad_explicit_facts(facts: dict[str, object], key: str) -> None:
    with pytest.raises(InputError) as e:
        model_facts_from_mapping(facts, "inventory.yaml")
    msg, file, got = _err(e)
    assert (file, got) == ("inventory.yaml", key), msg


def test_zero_or_nothing_still_means_none_where_a_model_can_have_none() -> None:
    m = model_facts_from_mapping({"weights_gib": 10, "kv_bytes_per_token": 10, "mtp_layers": 0,
                                  "moe_intermediate_size": 0, "draft_weights_gib": 0, "graph_gib": 0}, "x.yaml")
    assert m.mtp_layers == 0 and m.draft_weight_bytes == 0 and m.graph_gib == 0.0


@pytest.mark.parametrize(("change", "key"), [
    ({"max_position_embeddings": 0}, "max_position_embeddings"),    # the context length: a ZeroDivisionError
    ({"hidden_size": 10**400}, "hidden_size"),                      # float() of it: an OverflowError
])
def test_bad_numbers_in_config_json(tmp_path: Path, change: dict[str, object], key: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**GOOD, **change}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10}}))
    with pytest.raises(InputError) as e:
        model_facts_from_dir(tmp_path)
    _msg, file, got = _err(e)
    assert got == key and file is not None and file.endswith("config.json")
