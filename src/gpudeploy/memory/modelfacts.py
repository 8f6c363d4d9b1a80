"""Model facts the memory model needs, read from a model directory or given as explicit numbers.

Pure: the only I/O is reading ``config.json``, ``model.safetensors.index.json`` and safetensors
headers in a model directory, and only when :func:`model_facts_from_dir` is called.

From a directory (:func:`model_facts_from_dir`):
  * ``config.json`` (a multimodal ``text_config`` is merged over the top level): layers, KV heads,
    head_dim, MLA ranks (``kv_lora_rank``, ``qk_rope_head_dim``), hybrid layout (``layer_types``,
    ``full_attention_interval`` or NemotronH ``hybrid_override_pattern``), linear-attention /
    Mamba state dims, ``torch_dtype``, ``max_position_embeddings``, MTP layers
    (``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``), ``quantization_config``.
  * weights (:mod:`.checkpoint`): ``metadata.total_size`` of ``model.safetensors.index.json``, else
    the tensors' bytes in every ``*.safetensors`` file's header; never a parameter count times a
    dtype. The checkpoint size includes MTP layers; their own bytes come from the headers of the
    files that hold them, where those are here (else they are the layers' count's share, assumed).

Explicit numbers (:func:`model_facts_from_mapping`, e.g. a role's ``model_facts:`` block, for a
model that lives only on the GPU node). Accepted keys (unknown keys are an error):

  ``kind``                     "mha" | "mla" | "hybrid" (default "mha")
  ``weights_gib``              whole checkpoint in GiB (all ranks together, MTP layers included)
  ``weights_bytes``            the same in bytes (one of the two is required)
  ``kv_bytes_per_token``       KV bytes per token at TP1 in the KV cache dtype (MLA: any TP);
                               else computed from ``layers``/``kv_heads``/``head_dim``/...
  ``layers``                   decoder layers (not counting MTP layers)
  ``kv_heads``, ``head_dim``   full-attention KV heads and head size (MHA/GQA/hybrid)
  ``kv_lora_rank``, ``qk_rope_head_dim``   MLA
  ``full_attention_layers``, ``linear_layers``   hybrid layout
  ``state_bytes_per_request``  hybrid: conv+ssm state of one request at TP1, all linear layers
  ``dtype_bytes``              bytes per KV element with ``kv_cache_dtype`` auto (default 2)
  ``hidden_size``, ``vocab_size``, ``intermediate_size``, ``moe_intermediate_size``,
  ``num_experts_per_tok``      activation/graph sizing (defaults: 4096, 32000, 4 x hidden, 0, 0)
  ``context_length``           default context length (default 32768)
  ``mtp_layers``               MTP (NextN) layers shipped in the checkpoint (default 0)
  ``draft_weights_gib``        separate draft model (EAGLE/STANDALONE), all ranks together
  ``draft_layers``             that draft model's decoder layers (default 1, an EAGLE head)
  ``attention_chunk_size``     chunked local attention window (Llama 4), 0 if none
  ``graph_gib``                measured decode CUDA-graph memory ("Capture ... graph end ... mem
                               usage=X GB" of a previous run): replaces the estimate
  ``activation_kib_per_token`` override prefill activation memory per token (per rank)
  ``architecture``             config.json's ``architectures[0]`` (SGLang picks speculative defaults and,
                               in 0.4.6 - 0.4.9, the attention backend by it)
  ``multimodal``               a vision tower runs beside the model (SGLang lowers the fraction for it)
  ``vision_layers``, ``vision_hidden_size``   its ViT (SGLang's defaults when not given: 24, 1024)
  ``num_attention_heads``, ``q_lora_rank``, ``qk_nope_head_dim``, ``v_head_dim``   attention shape, for
                               the attention weights DP attention replicates on every rank
  ``attention_weights_gib``    those weights directly (all layers, TP1)
  ``assumed``                  true, or a list of what the numbers guess ("shape", "weights", ...): the
                               estimate then widens its error band for them (:mod:`.inputs`)
  ``name``                     label used in messages

Non-numeric, negative, infinite or absurdly large numbers (above 1 PiB for a size, 2^31 - 1 for a
count), a zero where a model cannot have none (weights, layers, context length, vocabulary, ...),
unknown kinds and missing required fields raise :class:`gpudeploy.errors.InputError` naming the
file (``where``) and the key (:data:`_MOST`, :data:`_POSITIVE`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudeploy.errors import InputError, Problem

from .checkpoint import Checkpoint, CheckpointError, read_checkpoint

GIB = float(1 << 30)
KINDS = ("mha", "mla", "hybrid")

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8_e4m3fn": 1, "fp8": 1, "float8": 1,
}


@dataclass(frozen=True)
class ModelFacts:
    """What the memory model needs to know about one model (sizes at TP1 unless noted)."""

    name: str
    kind: str                          # "mha" | "mla" | "hybrid"
    weight_bytes: int                  # whole checkpoint, MTP layers included
    layers: int                        # decoder layers, MTP layers excluded
    kv_heads: int = 0                  # full-attention KV heads (mha/hybrid)
    head_dim: int = 0
    kv_lora_rank: int = 0              # mla
    qk_rope_head_dim: int = 0          # mla
    full_attention_layers: int = 0     # layers that keep a KV cache (== layers unless hybrid)
    linear_layers: int = 0             # hybrid: linear-attention / mamba layers
    conv_state_bytes: int = 0          # hybrid: per request per linear layer, TP1
    ssm_state_bytes: int = 0           # hybrid: per request per linear layer, TP1 (fp32)
    dtype_bytes: int = 2               # KV element size with kv_cache_dtype=auto
    hidden_size: int = 4096
    vocab_size: int = 32000
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    context_length: int = 32768
    mtp_layers: int = 0
    draft_weight_bytes: int = 0        # separate draft model (EAGLE/STANDALONE), all ranks
    draft_layers: int = 1              # its decoder layers (an EAGLE head has one)
    attention_chunk_size: int = 0      # chunked local attention (Llama 4): FA3 keeps one more page table
    graph_gib: float | None = None     # measured "Capture ... graph end ... mem usage" of the decode graphs
    quantization: str | None = None
    kv_bytes_per_token_override: int | None = None   # TP1 value given explicitly
    state_bytes_override: int | None = None          # per request, TP1, all linear layers
    activation_bytes_per_token_override: int | None = None
    architecture: str = ""
    multimodal: bool = False
    vision_layers: int = 24                # SGLang's getattr defaults (adjust_mem_fraction_for_vlm)
    vision_hidden_size: int = 1024
    attention_weight_bytes: int = 0        # all layers' attention weights at TP1 (DP attention keeps them whole)
    assumed: tuple[str, ...] = ()          # which facts are guesses (empty: read or given as known)
    source: str = ""
    ssm_dtype_bytes: int = 4               # hybrid: the SSM state's element size (config.json mamba_ssm_dtype)
    mtp_weight_bytes: int | None = None    # the MTP layers' bytes as the safetensors headers give them
    weights_source: str = ""               # where weight_bytes comes from ("" : given in model facts)

    # ---- derived sizes -------------------------------------------------------------------
    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV cache bytes per token on one rank (SGLang's ``cell_size``)."""
        b = kv_dtype_bytes or self.dtype_bytes
        if self.kv_bytes_per_token_override is not None:
            base = self.kv_bytes_per_token_override * b // self.dtype_bytes
            if self.kind == "mla":
                return base
            heads = self.kv_heads or tp
            return base * max(1, heads // tp) // max(1, heads)
        if self.kind == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.layers * b
        layers = self.full_attention_layers if self.kind == "hybrid" else self.layers
        return 2 * max(1, self.kv_heads // tp) * self.head_dim * layers * b

    def kv_bytes_per_token_per_layer(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> float:
        layers = self.full_attention_layers if self.kind == "hybrid" else self.layers
        return self.kv_bytes_per_token(tp, kv_dtype_bytes) / max(1, layers)

    def state_bytes_per_request(self, tp: int = 1, ssm_dtype_bytes: int | None = None) -> int:
        """Hybrid models: conv + ssm state of one request on one rank, all linear layers
        (``ssm_dtype_bytes``: ``--mamba-ssm-dtype``'s element size, when it overrides the model's).
        Given as one number (``state_bytes_per_request``) the SSM part is not told apart from the conv
        window: a dtype override scales the whole (the conv window is 1-2 % of a GDN or Mamba2 state)."""
        if self.kind != "hybrid":
            return 0
        scale = (ssm_dtype_bytes or self.ssm_dtype_bytes) / self.ssm_dtype_bytes
        if self.state_bytes_override is not None:
            return math.ceil(self.state_bytes_override * scale / tp)
        return math.ceil((self.conv_state_bytes + self.ssm_state_bytes * scale) * self.linear_layers / tp)

    def target_weight_bytes(self) -> int:
        """Checkpoint bytes the target model loads (MTP layers excluded)."""
        if self.mtp_layers <= 0:
            return self.weight_bytes
        if self.mtp_weight_bytes is not None:
            return self.weight_bytes - self.mtp_weight_bytes
        return int(self.weight_bytes * self.layers / (self.layers + self.mtp_layers))

    def draft_bytes(self) -> int:
        """Bytes of the speculative draft: a separate draft model, else the MTP layers."""
        if self.draft_weight_bytes:
            return self.draft_weight_bytes
        return self.weight_bytes - self.target_weight_bytes()


# ---- helpers ---------------------------------------------------------------------------------

def _problem(where: str, key: str | None, message: str) -> InputError:
    return InputError([Problem(message=message, file=where, key=key)])


# What each number may be. Zero is refused where it makes no sense (a model has weights, layers, a
# context, a vocabulary; a zero context was a ZeroDivisionError in the budget) and kept where it
# means "none" (MTP layers, MoE sizes, a non-MLA model's MLA ranks). The ceilings are far above any
# real model and stop a typo or an .inf before the arithmetic meets it (1e308 GiB of weights was an
# OverflowError): a size at most 1 PiB, a KV element at most 8 bytes, any other count or dimension
# at most 2^31 - 1, the most an engine's int32 index tensors hold. config.json's names are here too.
PIB = 1 << 50
COUNT_MAX = (1 << 31) - 1
_MOST: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("weights_gib", "draft_weights_gib", "graph_gib", "attention_weights_gib"), (PIB >> 30, "1 PiB")),
    **dict.fromkeys(("weights_bytes", "total_size", "kv_bytes_per_token", "state_bytes_per_request"), (PIB, "1 PiB")),
    "activation_kib_per_token": (PIB >> 10, "1 PiB"),
    "dtype_bytes": (8, "8 bytes"),
}
_POSITIVE = frozenset({
    "weights_gib", "weights_bytes", "total_size", "kv_bytes_per_token", "state_bytes_per_request", "dtype_bytes",
    "layers", "num_hidden_layers", "context_length", "max_position_embeddings", "hidden_size", "vocab_size",
    "draft_layers", "vision_layers", "full_attention_interval", "conv_kernel", "linear_conv_kernel_dim",
})


def _num(d: Mapping[str, Any], key: str, where: str, *, required: bool = False,
         default: float | None = None, integer: bool = True) -> Any:
    if key not in d or d[key] is None:
        if required:
            raise _problem(where, key, f"missing required model fact '{key}'")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _problem(where, key, f"'{key}' must be a number, got {v!r}")
    # compared as they are: float() of a YAML integer past 1e308 is itself an OverflowError
    if isinstance(v, float) and not math.isfinite(v):
        raise _problem(where, key, f"'{key}' must be a finite number, got {v!r}")
    if v < 0:
        raise _problem(where, key, f"'{key}' must be a non-negative size, got {v!r}")
    if v == 0 and key in _POSITIVE:
        raise _problem(where, key, f"'{key}' must be more than 0, got {v!r}")
    most, words = _MOST.get(key, (COUNT_MAX, "2^31 - 1"))
    if v > most:
        raise _problem(where, key, f"'{key}' must be at most {most} ({words}), far above any real model, got {v!r}")
    if integer and float(v) != int(v):
        raise _problem(where, key, f"'{key}' must be a whole number, got {v!r}")
    return int(v) if integer else float(v)


def _gib_bytes(v: float) -> int:
    return round(v * GIB)


# ---- explicit numbers ------------------------------------------------------------------------

_MAPPING_KEYS = {
    "name", "kind", "weights_gib", "weights_bytes", "kv_bytes_per_token", "layers", "kv_heads",
    "head_dim", "kv_lora_rank", "qk_rope_head_dim", "full_attention_layers", "linear_layers",
    "state_bytes_per_request", "dtype_bytes", "hidden_size", "vocab_size", "intermediate_size",
    "moe_intermediate_size", "num_experts_per_tok", "context_length", "mtp_layers",
    "draft_weights_gib", "draft_layers", "attention_chunk_size", "graph_gib", "activation_kib_per_token",
    "quantization", "architecture", "multimodal", "vision_layers", "vision_hidden_size", "num_attention_heads",
    "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "attention_weights_gib", "assumed",
}
# given or guessed: a shape left out falls back to these defaults, which are then assumed
_SHAPE_DEFAULTS = ("hidden_size", "vocab_size")


def model_facts_from_mapping(d: Mapping[str, Any], where: str) -> ModelFacts:
    """Model facts from explicit numbers (keys in the module docstring); ``where`` names the file."""
    unknown = sorted(set(d) - _MAPPING_KEYS)
    if unknown:
        raise InputError([Problem(message=f"unknown model fact '{k}' (accepted: "
                                  f"{', '.join(sorted(_MAPPING_KEYS))})", file=where, key=k)
                          for k in unknown])
    kind = str(d.get("kind", "mha")).lower()
    if kind not in KINDS:
        raise _problem(where, "kind", f"kind must be one of {', '.join(KINDS)}, got {d.get('kind')!r}")
    if "weights_bytes" in d:
        weight_bytes = _num(d, "weights_bytes", where, required=True)
    else:
        weight_bytes = _gib_bytes(_num(d, "weights_gib", where, required=True, integer=False))
    kvpt = _num(d, "kv_bytes_per_token", where)
    layers = _num(d, "layers", where, required=kvpt is None, default=1)
    kv_heads = _num(d, "kv_heads", where, default=0)
    head_dim = _num(d, "head_dim", where, default=0)
    lora = _num(d, "kv_lora_rank", where, default=0)
    rope = _num(d, "qk_rope_head_dim", where, default=0)
    if kvpt is None:
        if kind == "mla" and not (lora and rope):
            raise _problem(where, "kv_lora_rank", "MLA needs kv_bytes_per_token or kv_lora_rank "
                           "and qk_rope_head_dim")
        if kind != "mla" and not (kv_heads and head_dim):
            raise _problem(where, "kv_heads", "needs kv_bytes_per_token or kv_heads and head_dim")
    full = _num(d, "full_attention_layers", where, default=layers)
    linear = _num(d, "linear_layers", where, default=max(0, layers - full))
    state = _num(d, "state_bytes_per_request", where)
    if kind == "hybrid" and state is None:
        raise _problem(where, "state_bytes_per_request",
                       "a hybrid model needs state_bytes_per_request (conv + ssm state, TP1)")
    draft = _num(d, "draft_weights_gib", where, default=0.0, integer=False)
    graph = _num(d, "graph_gib", where, integer=False)
    act = _num(d, "activation_kib_per_token", where, integer=False)
    dtype_bytes = _num(d, "dtype_bytes", where, default=2)
    assumed = _assumed(d, where)
    hidden = _num(d, "hidden_size", where, default=4096)
    heads = _num(d, "num_attention_heads", where, default=0)
    attn_gib = _num(d, "attention_weights_gib", where, integer=False)
    attn_bytes = _gib_bytes(attn_gib) if attn_gib is not None else attention_weight_bytes(
        kind, layers, hidden, heads, kv_heads, head_dim, _num(d, "q_lora_rank", where, default=0), lora, rope,
        _num(d, "qk_nope_head_dim", where, default=0), _num(d, "v_head_dim", where, default=0),
        1 if d.get("quantization") else 2)
    multimodal = d.get("multimodal", False)
    if not isinstance(multimodal, bool):
        raise _problem(where, "multimodal", f"'multimodal' must be true or false, got {multimodal!r}")
    return ModelFacts(
        name=str(d.get("name", where)), kind=kind, weight_bytes=weight_bytes, layers=layers,
        kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=lora, qk_rope_head_dim=rope,
        full_attention_layers=full, linear_layers=linear, dtype_bytes=dtype_bytes,
        hidden_size=hidden,
        vocab_size=_num(d, "vocab_size", where, default=32000),
        intermediate_size=_num(d, "intermediate_size", where, default=0),
        moe_intermediate_size=_num(d, "moe_intermediate_size", where, default=0),
        num_experts_per_tok=_num(d, "num_experts_per_tok", where, default=0),
        context_length=_num(d, "context_length", where, default=32768),
        mtp_layers=_num(d, "mtp_layers", where, default=0),
        draft_weight_bytes=_gib_bytes(draft),
        draft_layers=_num(d, "draft_layers", where, default=1),
        attention_chunk_size=_num(d, "attention_chunk_size", where, default=0),
        graph_gib=graph,
        quantization=str(d["quantization"]) if d.get("quantization") else None,
        kv_bytes_per_token_override=kvpt, state_bytes_override=state,
        activation_bytes_per_token_override=None if act is None else round(act * 1024),
        architecture=str(d.get("architecture") or ""), multimodal=multimodal,
        vision_layers=_num(d, "vision_layers", where, default=24),
        vision_hidden_size=_num(d, "vision_hidden_size", where, default=1024),
        attention_weight_bytes=attn_bytes, assumed=assumed, source=where,
    )


def _assumed(d: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """What the given facts guess: the ``assumed`` key, plus the shape keys left to defaults."""
    raw = d.get("assumed", False)
    if isinstance(raw, bool):
        out = ["shape"] if raw else []
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        out = list(raw)
    else:
        raise _problem(where, "assumed", f"'assumed' must be true, false or a list of names, got {raw!r}")
    missing = [k for k in _SHAPE_DEFAULTS if k not in d]
    if missing and "shape" not in out:
        out.append("shape")
    return tuple(out)


def attention_weight_bytes(kind: str, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                           q_lora: int, kv_lora: int, rope: int, nope: int, v_head: int, dtype: int) -> int:
    """All layers' attention projections at TP1, from the shape (0 when the shape does not say):
    MHA/GQA q, k, v, o; MLA (DeepSeek V2/V3) q_a, q_b (or q), kv_a, kv_b and o."""
    if kind == "mla":
        if not (heads and kv_lora and (nope or head_dim)):
            return 0
        nope = nope or head_dim
        v_head = v_head or nope
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        per_layer = q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_head) + heads * v_head * hidden
    else:
        if not (heads and head_dim):
            return 0
        per_layer = hidden * (heads + 2 * max(kv_heads, 1)) * head_dim + heads * head_dim * hidden
    return per_layer * layers * dtype


# ---- config.json + safetensors index ---------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise _problem(str(path), None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _problem(str(path), None, f"cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise _problem(str(path), None, f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise _problem(str(path), None, "expected a JSON object")
    return data


def _checkpoint(model_dir: Path, layers: int) -> Checkpoint:
    try:
        return read_checkpoint(model_dir, layers)
    except CheckpointError as e:
        raise _problem(e.file, e.key, e.message) from None


def model_facts_from_dir(path: str | Path) -> ModelFacts:
    """Model facts from ``config.json`` and the safetensors index (or single file) in ``path``."""
    model_dir = Path(path)
    cfg_path = model_dir / "config.json"
    top = _read_json(cfg_path)
    layers = config_layers(top, str(cfg_path))
    return model_facts_from_config(top, _checkpoint(model_dir, layers), str(cfg_path), model_dir.name)


def config_layers(top: Mapping[str, Any], where: str) -> int:
    """``num_hidden_layers`` of a config.json (a multimodal model's ``text_config``'s)."""
    text = top.get("text_config")
    cfg = {**top, **text} if isinstance(text, dict) else top
    return int(_num(cfg, "num_hidden_layers", where, required=True))


def model_facts_from_config(top: Mapping[str, Any], ckpt: Checkpoint, where: str, name: str) -> ModelFacts:
    """Model facts from a parsed ``config.json`` and what the checkpoint's files say
    (:func:`.checkpoint.read_checkpoint`, here or on the host that has the model)."""
    cfg: dict[str, Any] = dict(top)
    if isinstance(top.get("text_config"), dict):
        cfg.update(top["text_config"])

    def req(key: str) -> int:
        return int(_num(cfg, key, where, required=True))

    def opt(key: str, default: int = 0) -> int:
        return int(_num(cfg, key, where, default=default))

    layers = req("num_hidden_layers")
    hidden = req("hidden_size")
    heads = opt("num_attention_heads")
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    if dtype_name not in _DTYPE_BYTES:
        raise _problem(where, "torch_dtype", f"unknown torch_dtype {dtype_name!r}")
    dtype_bytes = _DTYPE_BYTES[dtype_name]
    if dtype_bytes == 1:   # FP8 checkpoints keep a bf16 KV cache unless --kv-cache-dtype says so
        dtype_bytes = 2
    quant = cfg.get("quantization_config")
    quantization = str(quant.get("quant_method")) if isinstance(quant, dict) else None
    mtp = opt("num_nextn_predict_layers") or opt("mtp_num_hidden_layers")
    archs = top.get("architectures")
    vision = top.get("vision_config") if isinstance(top.get("vision_config"), dict) else None
    common: dict[str, Any] = dict(
        architecture=str(archs[0]) if isinstance(archs, list) and archs else "",
        multimodal=vision is not None,
        vision_layers=int(_num(vision, "num_hidden_layers", where, default=24)) if vision else 24,
        vision_hidden_size=int(_num(vision, "hidden_size", where, default=1024)) if vision else 1024,
        name=name, weight_bytes=ckpt.total_bytes, weights_source=ckpt.source, layers=layers,
        dtype_bytes=dtype_bytes,
        hidden_size=hidden, vocab_size=req("vocab_size"),
        intermediate_size=opt("intermediate_size"),
        moe_intermediate_size=opt("moe_intermediate_size"),
        num_experts_per_tok=opt("num_experts_per_tok"),
        context_length=opt("max_position_embeddings", 32768),
        mtp_layers=mtp, quantization=quantization, source=where,
        attention_chunk_size=opt("attention_chunk_size"),
        mtp_weight_bytes=ckpt.draft_bytes if mtp else None,
        # the MTP layers' share, where no header here says it, is their count's: assumed
        assumed=("MTP layers' bytes",) if mtp and ckpt.draft_bytes is None else (),
    )

    weight_dtype = 1 if quantization else dtype_bytes
    if cfg.get("kv_lora_rank"):
        attn = attention_weight_bytes("mla", layers, hidden, heads, 0, 0, opt("q_lora_rank"), req("kv_lora_rank"),
                                      req("qk_rope_head_dim"), opt("qk_nope_head_dim"), opt("v_head_dim"),
                                      weight_dtype)
        attn = ckpt.attention_bytes or attn        # the headers' own bytes, quantized or not
        return ModelFacts(kind="mla", kv_lora_rank=req("kv_lora_rank"),
                          qk_rope_head_dim=req("qk_rope_head_dim"), full_attention_layers=layers,
                          attention_weight_bytes=attn, **common)

    kv_heads = opt("num_key_value_heads") or heads
    if not kv_heads:
        raise _problem(where, "num_key_value_heads", "missing num_key_value_heads / num_attention_heads")
    head_dim = opt("head_dim")
    if not head_dim:
        if not heads:
            raise _problem(where, "head_dim", "missing head_dim (and num_attention_heads to derive it)")
        head_dim = hidden // heads

    full, linear, conv, ssm = _hybrid_layout(cfg, where, layers)
    attn = attention_weight_bytes("mha", full, hidden, heads, kv_heads, head_dim, 0, 0, 0, 0, 0, weight_dtype)
    attn = ckpt.attention_bytes or attn            # the headers' own bytes, quantized or not
    if linear:
        # the SSM state's dtype: config.json's mamba_ssm_dtype (text_config's for a VL model), else
        # float32 (SGLang's configs/mamba_utils.py mamba2_state_dtype); _hybrid_layout counts 4 bytes
        ssm_name = str(cfg.get("mamba_ssm_dtype") or "float32").replace("torch.", "")
        ssm_bytes = _DTYPE_BYTES.get(ssm_name, 4)
        return ModelFacts(kind="hybrid", kv_heads=kv_heads, head_dim=head_dim,
                          full_attention_layers=full, linear_layers=linear, conv_state_bytes=conv,
                          ssm_state_bytes=ssm * ssm_bytes // 4, ssm_dtype_bytes=ssm_bytes,
                          attention_weight_bytes=attn, **common)
    return ModelFacts(kind="mha", kv_heads=kv_heads, head_dim=head_dim,
                      full_attention_layers=layers, attention_weight_bytes=attn, **common)


def _hybrid_layout(cfg: Mapping[str, Any], where: str, layers: int) -> tuple[int, int, int, int]:
    """(full-attention layers, linear layers, conv bytes, ssm bytes) per request per linear layer."""
    full = layers
    if isinstance(cfg.get("layer_types"), list):
        types = [str(t) for t in cfg["layer_types"]]
        full = sum(1 for t in types if t in ("full_attention", "attention"))
    elif cfg.get("full_attention_interval"):
        full = layers // int(_num(cfg, "full_attention_interval", where, required=True))
    elif isinstance(cfg.get("hybrid_override_pattern"), str):
        pattern = cfg["hybrid_override_pattern"]
        full = pattern.count("*")
        linear = pattern.count("M")
        n_heads = int(_num(cfg, "mamba_num_heads", where, required=True))
        head = int(_num(cfg, "mamba_head_dim", where, required=True))
        state = int(_num(cfg, "ssm_state_size", where, required=True))
        groups = int(_num(cfg, "n_groups", where, default=1))
        kernel = int(_num(cfg, "conv_kernel", where, default=4))
        conv_dim = n_heads * head + 2 * groups * state
        return full, linear, conv_dim * (kernel - 1) * 2, n_heads * head * state * 4
    else:
        return layers, 0, 0, 0
    linear = layers - full
    if linear <= 0:
        return layers, 0, 0, 0
    nk = int(_num(cfg, "linear_num_key_heads", where, required=True))
    nv = int(_num(cfg, "linear_num_value_heads", where, required=True))
    dk = int(_num(cfg, "linear_key_head_dim", where, required=True))
    dv = int(_num(cfg, "linear_value_head_dim", where, required=True))
    kernel = int(_num(cfg, "linear_conv_kernel_dim", where, default=4))
    conv_dim = 2 * nk * dk + nv * dv
    return full, linear, conv_dim * (kernel - 1) * 2, nv * dk * dv * 4
