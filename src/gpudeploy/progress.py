"""One progress line per unit while deploy waits: rewritten in place on a terminal, plain lines
when the output is a file or a pipe (then only when the phase changes or a quarter more is done).

The engine's own progress comes from its log: SGLang prints tqdm bars for loading checkpoint
shards and for capturing CUDA graphs (with the free memory in the bar's description).
"""

from __future__ import annotations

import re
import sys
import threading
from typing import TextIO

# SGLang's tqdm lines (tqdm writes "\r"-separated updates; the last one counts):
#   Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.20it/s]
#   Multi-thread loading shards: 100% Completed | 1/1 [00:00<00:00, 823.54it/s]
#     (0.5.23's default loader, model_loader/weight_utils.py buffered_multi_thread_safetensors_weights_iterator;
#     its BAR_FORMAT has no newline, so one journal record holds the whole bar: normal.log under
#     tests/verify/data/sglang-0.5.23-cpu/)
#   Capturing batches (bs=512 avail_mem=21.36 GB):  12%|█▎        | 6/52 [00:02<00:18,  2.45it/s]
_SHARDS = re.compile(r"(?:Loading (?:safetensors |pt )?checkpoint shards"
                     r"|Multi-thread loading (?:pt checkpoint )?shards):\s*\d+% Completed \| (\d+)/(\d+)")
_GRAPHS = re.compile(r"Capturing batches \(bs=(\d+)\s+avail_mem=([\d.]+)\s*GB\):\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")


def progress_of(line: str) -> tuple[str, float] | None:
    """(what the engine is doing, the fraction done) from one log line, or None."""
    last = line.split("\r")[-1] if "\r" in line else line
    m = _SHARDS.search(last)
    if m:
        n, total = int(m.group(1)), int(m.group(2))
        return f"checkpoint shards {n}/{total}", n / max(total, 1)
    m = _GRAPHS.search(last)
    if m:
        n, total = int(m.group(3)), int(m.group(4))
        return f"CUDA graphs {n}/{total} (bs {m.group(1)}, {m.group(2)} GB free)", n / max(total, 1)
    return None


class Board:
    """The lines of the units being waited for, kept at the bottom of a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.lines: dict[str, str] = {}
        self.shown = 0  # lines of the board on the terminal now
        self.last_quarter: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()

    def update(self, key: str, text: str, *, phase: str, fraction: float | None = None) -> None:
        with self.lock:
            if self.lines.get(key) == text:
                return
            self.lines[key] = text
            if self.tty:
                self._redraw()
                return
            quarter = int((fraction or 0.0) * 4)
            if self.last_quarter.get(key) != (phase, quarter):
                self.last_quarter[key] = (phase, quarter)
                self.stream.write(f"[{key}] {text}\n")
                self.stream.flush()

    def message(self, line: str) -> None:
        """A line that stays (a start, a cause): printed above the board."""
        with self.lock:
            if self.tty and self.shown:
                self.stream.write(f"\x1b[{self.shown}F\x1b[J")
                self.shown = 0
            self.stream.write(line + "\n")
            if self.tty:
                self._redraw()
            self.stream.flush()

    def done(self, key: str) -> None:
        with self.lock:
            self.lines.pop(key, None)
            if self.tty:
                self._redraw()

    def _redraw(self) -> None:
        out = f"\x1b[{self.shown}F\x1b[J" if self.shown else ""
        out += "".join(f"[{k}] {v}\n" for k, v in self.lines.items())
        self.shown = len(self.lines)
        self.stream.write(out)
        self.stream.flush()
