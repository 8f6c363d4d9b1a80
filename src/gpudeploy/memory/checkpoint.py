"""The checkpoint's real size, from its safetensors files: never assumed from a parameter count.

A quantized checkpoint (INT4, W4A8, FP8, NVFP4) mixes dtypes: packed 4-bit weights as U8, their
scales as F8/BF16/F32, the embeddings and norms in BF16. No one dtype times the parameter count gives
its size, and the layers' share of it is not their count's share (an MTP/NextN layer of DeepSeek V3
is one MoE layer plus its own projections, a Qwen3.5 MTP layer carries a whole embedding). So:

* ``model.safetensors.index.json``: the weights are its ``metadata.total_size`` (the sum of every
  tensor's bytes, as the shards' headers give them). Its ``weight_map`` names the shard of each
  tensor: where the shards that hold the MTP layers are here, their headers give the draft's bytes.
* single ``*.safetensors`` files (no index): each file's header gives every tensor's dtype, shape and
  byte range without reading the weights. The format (huggingface/safetensors, README "Format"):
  8 bytes, a little-endian unsigned 64-bit length N, then N bytes of JSON, an object of tensor name ->
  {"dtype", "shape", "data_offsets": [begin, end]} and an optional "__metadata__" of strings.

Stdlib only and pure but for reading the headers' bytes: the host probe can run it too.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# safetensors refuses a header above 100 MB (safetensors/src/tensor.rs MAX_HEADER_SIZE): so do we,
# before reading it, so a file that is not safetensors never makes us read gigabytes as JSON
MAX_HEADER = 100_000_000
INDEX = "model.safetensors.index.json"

# bytes per element of safetensors' dtypes (safetensors/src/tensor.rs Dtype); F4 packs two in a byte
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "E8M0": 8,
              "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


class CheckpointError(ValueError):
    """A safetensors file or index that cannot be read: ``file`` and ``key`` say where."""

    def __init__(self, file: str, key: str | None, message: str) -> None:
        super().__init__(message)
        self.file, self.key, self.message = file, key, message


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Checkpoint:
    """What the checkpoint's files say about its size."""

    total_bytes: int
    source: str                              # where the total comes from, in words
    draft_bytes: int | None = None           # the MTP/NextN layers' tensors; None: not readable here
    attention_bytes: int | None = None       # the attention projections' tensors (all layers)
    by_dtype: dict[str, int] = field(default_factory=dict)   # dtype -> bytes, where headers were read


def read_header(path: Path) -> list[Tensor]:
    """Every tensor of one ``.safetensors`` file, from its header alone."""
    where = str(path)
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(where, None, "not a safetensors file: shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if not 2 <= length <= MAX_HEADER:
                raise CheckpointError(where, None, f"not a safetensors file: a header of {length} bytes "
                                      f"(2 to {MAX_HEADER} expected)")
            raw = f.read(length)
            f.seek(0, 2)
            data_bytes = f.tell() - 8 - length
    except OSError as exc:
        raise CheckpointError(where, None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) < length:
        raise CheckpointError(where, None, f"not a safetensors file: its header says {length} bytes, "
                              f"the file holds {len(raw)}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(where, None, f"not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(where, None, "not a safetensors file: its header is not a JSON object")
    out = [_tensor(where, name, info) for name, info in doc.items() if name != "__metadata__"]
    end = max((t.nbytes + _begin(doc[t.name]) for t in out), default=0)
    if end > data_bytes:
        raise CheckpointError(where, None, f"cut short: its tensors end at byte {end} of the data, "
                              f"the file holds {data_bytes}")
    return out


def _begin(info: Mapping[str, Any]) -> int:
    return int(info["data_offsets"][0])


def _tensor(where: str, name: str, info: Any) -> Tensor:
    if not isinstance(info, dict):
        raise CheckpointError(where, name, f"tensor {name!r}: expected an object with dtype, shape, data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise CheckpointError(where, name, f"tensor {name!r}: dtype must be a string, got {dtype!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in shape)):
        raise CheckpointError(where, name, f"tensor {name!r}: shape must be a list of sizes, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(where, name, f"tensor {name!r}: data_offsets must be [begin, end], got {offsets!r}")
    nbytes = offsets[1] - offsets[0]
    bits = DTYPE_BITS.get(dtype)
    if bits is not None:
        elements = 1
        for d in shape:
            elements *= d
        if (elements * bits + 7) // 8 != nbytes:
            raise CheckpointError(where, name, f"tensor {name!r}: {dtype} of shape {shape} is "
                                  f"{(elements * bits + 7) // 8} bytes, its data_offsets span {nbytes}")
    return Tensor(name, dtype, tuple(shape), nbytes)


# ---- which tensors are the draft's and the attention's -------------------------------------------

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def is_mtp(name: str, layers: int) -> bool:
    """An MTP/NextN tensor: DeepSeek V3 / GLM-4.5 keep it as ``model.layers.<N>`` past the decoder's
    layers; Qwen3-Next / Qwen3.5 / NemotronH under ``mtp.``; MiMo under ``model.mtp_layers``."""
    if name.startswith("mtp.") or ".mtp." in name or "mtp_layers." in name:
        return True
    m = _LAYER.search(name)
    if m is None or name.startswith(("visual.", "vision_tower.", "model.visual.", "model.vision_tower.")):
        return False
    return int(m.group(1)) >= layers


def is_attention(name: str, layers: int) -> bool:
    """An attention projection of a decoder layer (``self_attn``), the MTP layers' left out."""
    return ".self_attn." in name and not is_mtp(name, layers)


def _sums(tensors: Iterable[Tensor], layers: int) -> tuple[int, int, int, dict[str, int]]:
    total = draft = attn = 0
    by_dtype: dict[str, int] = {}
    for t in tensors:
        total += t.nbytes
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
        if is_mtp(t.name, layers):
            draft += t.nbytes
        elif is_attention(t.name, layers):
            attn += t.nbytes
    return total, draft, attn, by_dtype


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_checkpoint(model_dir: Path, layers: int) -> Checkpoint:
    """The checkpoint in ``model_dir``: its index's total (and the draft's bytes from the shards that
    hold it, where they are here), else every ``*.safetensors`` file's header."""
    index = model_dir / INDEX
    if index.exists():
        return _from_index(model_dir, index, layers)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(str(model_dir), INDEX, f"no {INDEX} and no *.safetensors file in the model directory")
    tensors = [t for f in files for t in read_header(f)]
    total, draft, attn, by_dtype = _sums(tensors, layers)
    names = files[0].name if len(files) == 1 else f"{len(files)} files, {files[0].name} ..."
    return Checkpoint(total, f"the safetensors headers of {model_dir} ({names})", draft, attn, by_dtype)


def _from_index(model_dir: Path, index: Path, layers: int) -> Checkpoint:
    where = str(index)
    try:
        doc = json.loads(index.read_text())
    except OSError as exc:
        raise CheckpointError(where, None, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(where, None, f"not valid JSON: {exc}") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or "total_size" not in meta:
        raise CheckpointError(where, "metadata.total_size", "missing metadata.total_size")
    total = meta["total_size"]
    if not _int(total) and not (isinstance(total, float) and total.is_integer()):
        raise CheckpointError(where, "total_size", f"'total_size' must be a whole number, got {total!r}")
    total = int(total)
    if total < 0:
        raise CheckpointError(where, "total_size", f"'total_size' must be a non-negative size, got {total!r}")
    if total == 0 or total > 1 << 50:
        raise CheckpointError(where, "total_size", f"'total_size' must be more than 0 and at most 1 PiB, got {total!r}")
    weight_map = doc.get("weight_map") if isinstance(doc.get("weight_map"), dict) else {}
    source = f"{where} metadata.total_size"
    mtp = {str(n): str(f) for n, f in weight_map.items() if is_mtp(str(n), layers)}
    if not mtp:
        return Checkpoint(total, source, 0 if weight_map else None)
    shards = sorted(set(mtp.values()))
    if not all((model_dir / s).is_file() and "/" not in s for s in shards):
        return Checkpoint(total, source, None)     # the shards are on the GPU node only
    draft = sum(t.nbytes for s in shards for t in read_header(model_dir / s) if t.name in mtp)
    return Checkpoint(total, f"{source}; the MTP layers' bytes from {', '.join(shards)}", draft)


# ---- carried from a host ----------------------------------------------------------------------

def to_json(c: Checkpoint) -> dict[str, Any]:
    return {"total_bytes": c.total_bytes, "source": c.source, "draft_bytes": c.draft_bytes,
            "attention_bytes": c.attention_bytes, "by_dtype": dict(c.by_dtype)}


def from_json(d: Any, where: str) -> Checkpoint:
    """A :func:`to_json` answer (the host probe's), checked: whole byte counts, a source in words."""
    if not isinstance(d, dict):
        raise CheckpointError(where, None, f"expected the checkpoint's sizes, got {d!r}")
    total, source = d.get("total_bytes"), d.get("source")
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0 or not isinstance(source, str):
        raise CheckpointError(where, "total_bytes", f"the checkpoint's size must be a whole number of bytes, "
                              f"got {total!r}")
    extra = {k: d.get(k) for k in ("draft_bytes", "attention_bytes")}
    for k, v in extra.items():
        if v is not None and (not _int(v) or v < 0 or v > total):
            raise CheckpointError(where, k, f"{k} must be a whole number of bytes up to the checkpoint's, got {v!r}")
    by_dtype = d.get("by_dtype") or {}
    if not isinstance(by_dtype, dict) or not all(isinstance(k, str) and _int(v) for k, v in by_dtype.items()):
        raise CheckpointError(where, "by_dtype", f"by_dtype must map dtypes to bytes, got {by_dtype!r}")
    return Checkpoint(int(total), source, extra["draft_bytes"], extra["attention_bytes"], dict(by_dtype))
