"""tqdm's progress output, byte for byte, without tqdm: what SGLang's rank 0 writes to stderr.

Stdlib only (see the package docstring). This mirrors tqdm 4.70's ``tqdm.std`` for the two bars SGLang
0.5.x shows while it starts, used as ``for x in tqdm(...)`` loops:

* Checkpoint loading, python/sglang/srt/model_loader/weight_utils.py (``safetensors_weights_iterator``):
  ``tqdm(hf_weights_files, desc="Loading safetensors checkpoint shards", disable=not enable_tqdm,
  bar_format=_BAR_FORMAT)`` with ``_BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed |
  {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\\n"`` -- note the newline: SGLang (like vLLM,
  where it comes from) ends every update with "\\n" "to avoid messing up with ray or multiprocessing".
  Only global rank 0 shows it. A 2-shard load writes, e.g. (SGLang's docs notebooks, CI, 2026-02-13)::

      Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]
      Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:00<00:00,  1.81it/s]
      Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.24s/it]
      Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.13s/it]
      (an empty line)

  each update preceded by "\\r" (the 100% line twice: the last update, then ``close()`` with the
  overall rate, then close's own "\\n").

* CUDA-graph capture, python/sglang/srt/model_executor/cuda_graph_runner.py (``capture``):
  ``capture_range = tqdm.tqdm(list(reversed(self.capture_bs)))`` on TP rank 0, and per batch size,
  before capturing it, ``capture_range.set_description(f"Capturing batches ({bs=} {avail_mem=:.2f}
  GB)")`` (free GPU memory in GiB). Default format ``{l_bar}{bar}{r_bar}``, no newline until the bar
  closes. Seen in the same notebooks (non-TTY; the \\r's dropped by the page)::

        0%|          | 0/4 [00:00<?, ?it/s]Capturing batches (bs=4 avail_mem=23.12 GB):   0%|   ...
      ...Capturing batches (bs=1 avail_mem=19.70 GB): 100%|██████████| 4/4 [00:00<00:00, 12.61it/s]

  ``set_description`` refreshes at once but shows the count as of the last timed update (tqdm's
  ``__iter__`` syncs ``n`` only when it prints, at most every ``mininterval`` = 0.1 s).

On a terminal tqdm rewrites one line in place ("\\r"); the bar is as wide as the terminal (tqdm 4.70:
``os.get_terminal_size(stderr) - 1`` columns). When stderr is not a terminal (a systemd unit: the
journal) nothing changes but the width: the bar is 10 characters and updates are still separated by
"\\r" only. journald cuts records at "\\n" or NUL only (or LineMax=, 48 KiB; or when another PID writes
to the same stream), so under systemd each checkpoint-shard update is its own record (starting with
"\\r"), while the whole CUDA-graph capture becomes ONE record, written when the bar closes: all its
updates joined by "\\r". ``journalctl -o json`` sends such a MESSAGE as an array of bytes (\\r is a
control character) and as null when it is 4096 bytes or more, unless ``--all``.

tqdm reads ``TQDM_*`` environment variables as defaults for arguments the caller did not pass
(``tqdm.utils.envwrap``, tqdm >= 4.66); this honours ``TQDM_MININTERVAL``, ``TQDM_NCOLS`` and
``TQDM_BAR_FORMAT`` the same way. SGLang passes no ``bar_format`` for the capture bar, so a unit with
``TQDM_BAR_FORMAT={l_bar}{bar}{r_bar}<a real newline>`` in its environment gets one journal record per
capture update -- from real SGLang as from this stand-in.
"""

from __future__ import annotations

import contextlib
import os
import time
import unicodedata
from collections.abc import Callable

# The bars' own texts (see the module docstring for where they come from). 0.5.23 loads safetensors
# shards with its multi-threaded loader by default (model_loader/loader.py: enable_multithread_load
# True), whose bar is ``with tqdm(total=len(files), desc="Multi-thread loading shards",
# bar_format=BAR_FORMAT) as pbar: ... pbar.update(1)`` (model_loader/weight_utils.py), and its
# BAR_FORMAT (srt/utils/common.py) has no newline any more: the real server's
# "\rMulti-thread loading shards:   0% Completed | 0/1 [00:00<?, ?it/s]\rMulti-thread loading shards:
# 100% Completed | 1/1 [00:00<00:00, 823.54it/s]\n" (tests/verify/data/sglang-0.5.23-cpu/normal.log).
SHARDS_DESC = "Multi-thread loading shards"
SHARDS_BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
# 0.5.9's: the single-threaded loader's bar, which ended every update with a newline
SHARDS_DESC_059 = "Loading safetensors checkpoint shards"
SHARDS_BAR_FORMAT_059 = SHARDS_BAR_FORMAT + "\n"


def capture_desc(bs: int, avail_gib: float) -> str:
    return f"Capturing batches (bs={bs} avail_mem={avail_gib:.2f} GB)"


UTF_CHARSET = " " + "".join(map(chr, range(0x258F, 0x2587, -1)))  # " ▏▎▍▌▋▊▉█"


class _EMA:
    """tqdm.std.EMA: exponential moving average with bias correction."""

    def __init__(self, smoothing: float = 0.3) -> None:
        self.alpha = smoothing
        self.last = 0.0
        self.calls = 0

    def __call__(self, x: float | None = None) -> float:
        beta = 1 - self.alpha
        if x is not None:
            self.last = self.alpha * x + beta * self.last
            self.calls += 1
        return self.last / (1 - beta**self.calls) if self.calls else self.last


def format_interval(t: float) -> str:
    sign = "-" if t < 0 else ""
    mins, s = divmod(abs(int(t)), 60)
    h, m = divmod(mins, 60)
    return f"{sign}{h:d}:{m:02d}:{s:02d}" if h else f"{sign}{m:02d}:{s:02d}"


def disp_len(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "FW" else 1 for ch in text)


class _Bar:
    """tqdm.std.Bar with the UTF charset: ``{bar}``, ``{bar:N}``."""

    def __init__(self, frac: float, default_len: int) -> None:
        self.frac = frac
        self.default_len = default_len

    def __format__(self, spec: str) -> str:
        width = self.default_len
        if spec and spec[-1].lower() in "aub":
            spec = spec[:-1]
        if spec:
            width = int(spec) + (self.default_len if int(spec) < 0 else 0)
        nsyms = len(UTF_CHARSET) - 1
        full, part = divmod(int(self.frac * width * nsyms), nsyms)
        res = UTF_CHARSET[-1] * full
        if full < width:
            res += UTF_CHARSET[part] + UTF_CHARSET[0] * (width - full - 1)
        return res


class _Probe:
    """tqdm.utils.FormatReplace: renders as "" and notes that ``{bar}`` was asked for."""

    def __init__(self) -> None:
        self.called = False

    def __format__(self, spec: str) -> str:
        self.called = True
        return ""


def format_meter(n: int, total: int, elapsed: float, ncols: int | None = None, prefix: str = "",
                 rate: float | None = None, bar_format: str | None = None) -> str:
    """tqdm.std.tqdm.format_meter for a known total, unit "it", no unit scaling, no postfix."""
    total_opt: int | None = total
    if total and n >= total + 0.5:
        total_opt = None
    elapsed_str = format_interval(elapsed)
    if rate is None and elapsed:
        rate = n / elapsed
    inv_rate = 1 / rate if rate else None
    rate_noinv_fmt = (f"{rate:5.2f}" if rate else "?") + "it/s"
    rate_inv_fmt = (f"{inv_rate:5.2f}" if inv_rate else "?") + "s/it"
    rate_fmt = rate_inv_fmt if inv_rate and inv_rate > 1 else rate_noinv_fmt
    n_fmt, total_fmt = str(n), str(total_opt) if total_opt is not None else "?"
    remaining = (total_opt - n) / rate if rate and total_opt else 0
    remaining_str = format_interval(remaining) if rate else "?"
    l_bar = (prefix if prefix[-2:] == ": " else prefix + ": ") if prefix else ""
    r_bar = f"| {n_fmt}/{total_fmt} [{elapsed_str}<{remaining_str}, {rate_fmt}]"
    fields: dict[str, object] = {
        "n": n, "n_fmt": n_fmt, "total": total_opt, "total_fmt": total_fmt, "elapsed": elapsed_str,
        "elapsed_s": elapsed, "ncols": ncols, "desc": prefix or "", "unit": "it",
        "rate": inv_rate if inv_rate and inv_rate > 1 else rate, "rate_fmt": rate_fmt,
        "rate_noinv": rate, "rate_noinv_fmt": rate_noinv_fmt, "rate_inv": inv_rate,
        "rate_inv_fmt": rate_inv_fmt, "postfix": "", "unit_divisor": 1000, "remaining": remaining_str,
        "remaining_s": remaining, "r_bar": r_bar}
    if not total_opt:
        return f"{l_bar}{n_fmt}it [{elapsed_str}, {rate_fmt}]"
    frac = n / total_opt
    percentage = frac * 100
    l_bar += f"{percentage:3.0f}%|"
    if ncols == 0:
        return l_bar[:-1] + r_bar[1:]
    fields["l_bar"] = l_bar
    if bar_format:
        fields["percentage"] = percentage
        if not prefix:
            bar_format = bar_format.replace("{desc}: ", "")
    else:
        bar_format = "{l_bar}{bar}{r_bar}"
    probe = _Probe()
    nobar = bar_format.format(bar=probe, **fields)
    if not probe.called:
        return nobar[:ncols] if ncols else nobar
    res = bar_format.format(bar=_Bar(frac, max(1, ncols - disp_len(nobar)) if ncols else 10), **fields)
    return res[:ncols] if ncols else res


def stderr_write(text: str) -> None:
    """One write(2) to fd 2 per update, as tqdm's write + flush to an unbuffered stream."""
    data = text.encode()
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data):]


def _terminal_ncols(fd: int = 2) -> int | None:
    """tqdm 4.70's width for a bar on stderr: the terminal's columns - 1, else None (10-char bar)."""
    try:
        return os.get_terminal_size(fd).columns - 1
    except OSError:
        return None


def _env(name: str) -> str | None:
    return os.environ.get("TQDM_" + name.upper())


class Tqdm:
    """One ``for x in tqdm(iterable)`` loop: call :meth:`set_description` inside the body as the code
    does, :meth:`iterated` at the end of each pass, :meth:`close` after the loop."""

    def __init__(self, total: int, desc: str | None = None, bar_format: str | None = None,
                 write: Callable[[str], None] = stderr_write, clock: Callable[[], float] = time.monotonic,
                 ncols: int | None = None, tty_fd: int | None = 2) -> None:
        env_mininterval, env_ncols, env_format = _env("mininterval"), _env("ncols"), _env("bar_format")
        self.mininterval = 0.1
        if env_mininterval:
            with contextlib.suppress(ValueError):
                self.mininterval = float(env_mininterval)
        if ncols is None and env_ncols:
            with contextlib.suppress(ValueError):
                ncols = int(env_ncols)
        if ncols is None and tty_fd is not None:
            ncols = _terminal_ncols(tty_fd)
        self.ncols = ncols
        self.bar_format = bar_format if bar_format is not None else env_format
        self.total = total
        self.desc = desc or ""  # tqdm adds ": " in set_description only
        self._write = write
        self._clock = clock
        self.n = 0  # as last printed (tqdm's self.n while iterating)
        self._iter_n = 0  # __iter__'s local counter
        self.last_print_n = 0
        self.miniters = 0.0
        self._ema_dn, self._ema_dt, self._ema_miniters = _EMA(), _EMA(), _EMA()
        self._overall = False
        self._last_len = 0
        self.closed = False
        self.start_t = self.last_print_t = clock()
        self.refresh()

    def __str__(self) -> str:
        ema_dt = None if self._overall else self._ema_dt()
        rate = self._ema_dn() / ema_dt if ema_dt else None
        return format_meter(self.n, self.total, self._clock() - self.start_t, self.ncols, self.desc, rate,
                            self.bar_format)

    def refresh(self) -> None:
        s = str(self)
        length = disp_len(s)
        self._write("\r" + s + " " * max(self._last_len - length, 0))
        self._last_len = length

    def set_description(self, desc: str) -> None:
        self.desc = desc + ": " if desc else ""
        self.refresh()

    def update(self, n: int = 1) -> None:
        """``pbar.update(n)`` of a ``with tqdm(total=...) as pbar`` bar (0.5.23's shard loader)."""
        self._iter_n += n
        self._update(n)

    def iterated(self) -> None:
        self._iter_n += 1
        if self._iter_n - self.last_print_n < self.miniters:
            return
        if self._clock() - self.last_print_t >= self.mininterval:
            self._update(self._iter_n - self.n)

    def _update(self, inc: int) -> None:
        self.n += inc
        if self.n - self.last_print_n < self.miniters:
            return
        cur_t = self._clock()
        dt = cur_t - self.last_print_t
        if dt < self.mininterval:
            return
        dn = self.n - self.last_print_n
        if dt and dn:
            self._ema_dn(dn)
            self._ema_dt(dt)
        self.refresh()
        if dt >= 10.0:  # maxinterval
            self.miniters = dn * self.mininterval / dt
        else:
            self.miniters = self._ema_miniters(dn * (self.mininterval / dt if self.mininterval and dt else 1))
        self.last_print_n = self.n
        self.last_print_t = cur_t

    def close(self) -> None:
        """The loop ended: the final count with the overall rate, then a newline (leave=True)."""
        if self.closed:
            return
        self.closed = True
        self.n = self._iter_n
        self._overall = True
        self.refresh()
        self._write("\n")
