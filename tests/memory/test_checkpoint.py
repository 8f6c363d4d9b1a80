"""Quantized checkpoints: the weights' bytes come from the safetensors index or the files' own headers,
never from a parameter count times a dtype; where they are a guess, the verdict says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors_files

from gpudeploy.errors import InputError
from gpudeploy.memory import EngineSettings, budget
from gpudeploy.memory.modelfacts import model_facts_from_dir, model_facts_from_mapping

FIX = Path(__file__).parent / "fixtures"
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 2, "hidden_size": 512, "vocab_size": 4096, "torch_dtype": "bfloat16",
         "quantization_config": {"quant_method": "modelopt_fp4"}}


def _nvfp4_layer(i: int, hidden: int = 512) -> dict[str, tuple[str, list[int]]]:
    """One decoder layer as an NVFP4 checkpoint keeps it: two 4-bit weights packed in a U8, an FP8
    scale per 16 of them, a BF16 norm."""
    out: dict[str, tuple[str, list[int]]] = {}
    for proj, rows in (("self_attn.q_proj", hidden), ("self_attn.k_proj", 128), ("self_attn.v_proj", 128),
                       ("self_attn.o_proj", hidden), ("mlp.gate_proj", 4 * hidden), ("mlp.down_proj", hidden)):
        out[f"model.layers.{i}.{proj}.weight"] = ("U8", [rows, hidden // 2])
        out[f"model.layers.{i}.{proj}.weight_scale"] = ("F8_E4M3", [rows, hidden // 16])
    out[f"model.layers.{i}.input_layernorm.weight"] = ("BF16", [hidden])
    return out


def test_single_files_without_an_index_are_sized_from_their_headers(tmp_path: Path) -> None:
    """Two shards and no index (as some quantizers write them): the tensors' bytes, dtype by dtype;
    before, a directory without model.safetensors.index.json or model.safetensors was refused."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    first = safetensors_files.write(tmp_path / "model-00001-of-00002.safetensors",
                                    {"model.embed_tokens.weight": ("BF16", [4096, 512]), **_nvfp4_layer(0)})
    second = safetensors_files.write(tmp_path / "model-00002-of-00002.safetensors",
                                     {**_nvfp4_layer(1), "lm_head.weight": ("BF16", [4096, 512])})
    m = model_facts_from_dir(tmp_path)
    assert m.weight_bytes == first + second
    # the parameter count times BF16 is half as much again: the layers' 4-bit weights are packed
    params = 2 * 4096 * 512 + 2 * sum(r * 512 for r in (512, 128, 128, 512, 2048, 512)) + 2 * 512
    assert m.weight_bytes < 0.7 * params * 2
    assert "safetensors headers" in m.weights_source and "2 files" in m.weights_source
    # the attention projections are their headers' bytes (DP attention keeps them whole on a rank)
    q, kv, o = 512 * 256 + 512 * 32, 128 * 256 + 128 * 32, 512 * 256 + 512 * 32
    assert m.attention_weight_bytes == 2 * (q + 2 * kv + o)


def test_one_file_is_its_tensors_not_its_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    size = safetensors_files.write(tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [64, 512])},
                                   metadata={"format": "pt"})
    assert model_facts_from_dir(tmp_path).weight_bytes == size < (tmp_path / "model.safetensors").stat().st_size


DEEPSEEK = json.loads((FIX / "deepseek-v3" / "config.json").read_text())


def _deepseek_index(tmp_path: Path, total: int, *, shard_here: bool, whole: bool = True) -> int:
    """A DeepSeek-V3-shaped checkpoint (its config, small tensors) whose MTP layer (model.layers.61)
    sits in the last shard with the head; returns the MTP layer's bytes."""
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK))
    mtp = {"model.layers.61.eh_proj.weight": ("F8_E4M3", [256, 512]),
           "model.layers.61.embed_tokens.weight": ("BF16", [1024, 256]),
           "model.layers.61.mlp.experts.0.up_proj.weight": ("F8_E4M3", [64, 256]),
           "model.layers.61.shared_head.head.weight": ("BF16", [1024, 256])}
    last = "model-00163-of-00163.safetensors"
    weight_map = {"model.layers.60.mlp.experts.0.up_proj.weight": "model-00162-of-00163.safetensors",
                  "lm_head.weight": last, **dict.fromkeys(mtp, last)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    if shard_here:
        safetensors_files.write(tmp_path / last, {"lm_head.weight": ("BF16", [1024, 256]), **mtp}, data=whole)
    return 256 * 512 + 2 * 1024 * 256 * 2 + 64 * 256


def test_the_mtp_layers_bytes_come_from_the_shard_that_holds_them(tmp_path: Path) -> None:
    """A NextN layer carries its own embedding and head, so its bytes are not its count's share of the
    checkpoint (1/62 here): they are what the shard's header says. Before, the target was taken as
    61/62 of the checkpoint whatever the layer held."""
    total = 50_000_000
    _deepseek_index(tmp_path, total, shard_here=True, whole=False)
    with pytest.raises(InputError) as cut:       # a shard cut short is named, not read past
        model_facts_from_dir(tmp_path)
    assert "cut short" in str(cut.value) and "model-00163-of-00163.safetensors" in str(cut.value)

    mtp = _deepseek_index(tmp_path, total, shard_here=True)
    m = model_facts_from_dir(tmp_path)
    assert m.draft_bytes() == mtp != round(total / 62)
    assert m.target_weight_bytes() == total - mtp
    assert "model-00163-of-00163.safetensors" in m.weights_source and not m.assumed


def test_without_the_shards_the_mtp_split_is_said_to_be_assumed(tmp_path: Path) -> None:
    _deepseek_index(tmp_path, 688_586_727_753, shard_here=False)
    m = model_facts_from_dir(tmp_path)
    assert m.mtp_weight_bytes is None and m.assumed == ("MTP layers' bytes",)
    b = budget(139.8, m, EngineSettings(tp_size=8, speculative_algorithm="EAGLE"), release="0.5.23")
    term = next(i for i in b.inputs if i.name == "MTP layers' bytes")
    assert not term.grounded and "safetensors index" in term.certain_by


def test_the_verdict_says_where_the_checkpoint_size_came_from() -> None:
    read = budget(79.19, model_facts_from_dir(FIX / "llama-3.1-70b"), EngineSettings(tp_size=4), release="0.5.23")
    term = next(i for i in read.inputs if i.name == "checkpoint size")
    assert term.grounded and "model.safetensors.index.json metadata.total_size" in term.source
    guessed = model_facts_from_mapping({"weights_bytes": 141_000_000_000, "kind": "mha", "layers": 80,
                                        "kv_heads": 8, "head_dim": 128, "hidden_size": 8192, "vocab_size": 128256,
                                        "assumed": ["weights"]}, "roles/llama.yaml")
    b = budget(79.19, guessed, EngineSettings(tp_size=4), release="0.5.23")
    term = next(i for i in b.inputs if i.name == "checkpoint size")
    assert not term.grounded and term.source.startswith("assumed from the parameter count and dtype")
    assert "checkpoint size" in b.to_json()["assumed"]


@pytest.mark.parametrize(("content", "words"), [
    (b"\x00" * 64, "header of 0 bytes"),
    ((4).to_bytes(8, "little") + b"{no}", "not JSON"),
    ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
    (b"\x01", "shorter than"),
])
def test_a_file_that_is_not_safetensors_is_named(tmp_path: Path, content: bytes, words: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(InputError) as e:
        model_facts_from_dir(tmp_path)
    assert words in str(e.value) and str(tmp_path / "model.safetensors") in str(e.value)


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    header = json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [512], "data_offsets": [0, 512]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(512))
    with pytest.raises(InputError) as e:
        model_facts_from_dir(tmp_path)
    problem = e.value.problems[0]
    assert problem.key == "model.norm.weight" and "1024 bytes" in problem.message
