"""Small real safetensors files for the tests, written by hand (the ``safetensors`` package may not be
installed): 8 bytes of little-endian header length, the JSON header, then the tensors' bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BITS = {"U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E8M0": 8, "BF16": 16, "F16": 16, "F32": 32, "I32": 32, "F4": 4}


def write(path: Path, tensors: dict[str, tuple[str, list[int]]], *, metadata: dict[str, str] | None = None,
          data: bool = True) -> int:
    """Write ``tensors`` (name -> (dtype, shape)) to ``path`` as zeros; return the tensors' bytes.
    ``data=False`` leaves the data out (a file cut short)."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        elements = 1
        for d in shape:
            elements *= d
        size = (elements * BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)          # as safetensors pads it
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (bytes(offset) if data else b""))
    return offset
