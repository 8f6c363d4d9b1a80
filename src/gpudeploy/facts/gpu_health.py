"""Runs ON the host (inside the host probe, and alone as ``status --watch``'s kernel-log follower): what
NVML and the kernel log say of each GPU's health. Stdlib and pynvml only.

NVML, per GPU (``device_health``): row remapping (pending, failed, rows remapped for correctable and
uncorrectable errors), the retired pages where a GPU has no row remapping (before Ampere), ECC mode and
its uncorrected volatile and aggregate counts, the clocks event ("throttle") reasons decoded to words,
the temperature, the PCIe link's generation and width against the most this slot can train to, NVLink's
links where the GPU has any. A function the installed nvidia-ml-py lacks, or that answers NotSupported
(a PCIe card has no NVLink; an H100 no page retirement), gives None: unknown, never an error. A GPU that
answers NVML_ERROR_GPU_IS_LOST is reported as lost, never raised (it must not end the probe).

The kernel log (``kernel_xids``, ``follow``): the driver's Xid lines, ``NVRM: Xid (PCI:0000:41:00): 79,
pid=..., GPU has fallen off the bus.``, each with the host's time and its PCI bus id, mapped to the
GPU's NVML index (``map_xids``). Read from the journal (``journalctl -k``) where it carries the kernel's
lines, else from ``/dev/kmsg`` (what ``dmesg`` reads), else ``dmesg``. An NVML stand-in (the lab's) may
name a file that stands for its host's kernel log, in ``journalctl -o short-unix`` form: a container
has no kernel log of its own (systemd-nspawn gives it no /dev/kmsg and drops CAP_SYSLOG).

    python3 -c SOURCE follow '{"since": 1765000000.0}'   # JSON lines: {"source"}, {"xid": {...}}, {"alive"}
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16

# nvmlClocksEventReason* (nvidia-ml-py 13; the older nvmlClocksThrottleReason* have the same bits).
# Which of them slow a GPU that should run fast is decided by the caller (facts/health.py).
CLOCK_REASONS = (
    (0x1, "idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
NVLINK_MAX_LINKS = 18  # an H100 SXM has 18; nvidia-ml-py's own constant (36 in 13.x) wins where it has one


def decode_clock_reasons(mask: int) -> list[str]:
    """NVML's clocks event reasons bit mask -> its words, in bit order; a bit NVML named after this
    table was written comes as its hex value (never dropped)."""
    words = [word for bit, word in CLOCK_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            words.append(hex(bit))
            rest &= ~bit
        bit <<= 1
    return words


# -- NVML ----------------------------------------------------------------------------------------------

def error_code(exc: BaseException) -> int | None:
    """An NVMLError's code (``.value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_lost(exc: BaseException) -> bool:
    return error_code(exc) in (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED)


class _Gone(Exception):
    """The GPU went away while it was read (GPU_IS_LOST or RESET_REQUIRED): the whole GPU is reported so."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _ask(nvml: Any, name: str, *args: Any) -> Any:
    """``nvml.<name>(*args)``, None where nvidia-ml-py lacks it or NVML does not support it; a lost
    GPU raises _Gone (one lost answer makes the GPU lost, not a field unknown)."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception as exc:
        if is_lost(exc):
            raise _Gone(exc) from None
        return None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def device_health(nvml: Any, handle: Any) -> dict[str, Any]:
    """What NVML says of one GPU's health; each part None where NVML cannot say."""
    try:
        return _read_health(nvml, handle)
    except _Gone as gone:
        return lost_health(gone.exc)


def lost_health(exc: BaseException) -> dict[str, Any]:
    code = error_code(exc)
    return {"lost": code != NVML_ERROR_RESET_REQUIRED, "reset_required": code == NVML_ERROR_RESET_REQUIRED,
            "error": f"{type(exc).__name__}: {exc}"}


def _read_health(nv: Any, h: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"lost": False, "reset_required": False}
    rows = _ask(nv, "nvmlDeviceGetRemappedRows", h)
    if rows is not None and len(rows) >= 4:
        out["remapped_rows"] = {"correctable": _int(rows[0]), "uncorrectable": _int(rows[1]),
                                "pending": bool(rows[2]), "failed": bool(rows[3])}
    else:
        out["remapped_rows"] = None
    out["retired_pages"] = None
    if out["remapped_rows"] is None:
        # Before Ampere a GPU retires pages instead (row remapping replaces it from A100 on, where
        # this answers NotSupported: the H100 probe). Cause 0: multiple single-bit, 1: double-bit.
        single = _ask(nv, "nvmlDeviceGetRetiredPages", h, 0)
        double = _ask(nv, "nvmlDeviceGetRetiredPages", h, 1)
        pending = _ask(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if single is not None or double is not None or pending is not None:
            out["retired_pages"] = {"single_bit": len(single) if single is not None else None,
                                    "double_bit": len(double) if double is not None else None,
                                    "pending": bool(pending) if pending is not None else None}
    mode = _ask(nv, "nvmlDeviceGetEccMode", h)
    # nvmlDeviceGetTotalEccErrors(h, error type, counter type): type 1 uncorrected, 0 corrected;
    # counter 0 volatile (since the driver loaded), 1 aggregate (the GPU's lifetime, in its infoROM)
    unc_vol = _ask(nv, "nvmlDeviceGetTotalEccErrors", h, 1, 0)
    unc_agg = _ask(nv, "nvmlDeviceGetTotalEccErrors", h, 1, 1)
    cor_vol = _ask(nv, "nvmlDeviceGetTotalEccErrors", h, 0, 0)
    if mode is not None or unc_vol is not None or unc_agg is not None:
        out["ecc"] = {"enabled": bool(mode[0]) if mode is not None and len(mode) else None,
                      "uncorrected_volatile": _int(unc_vol), "uncorrected_aggregate": _int(unc_agg),
                      "corrected_volatile": _int(cor_vol)}
    else:
        out["ecc"] = None
    mask = _ask(nv, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _ask(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h)  # before nvidia-ml-py 12.535
    out["clocks_event_reasons"] = {"mask": int(mask), "reasons": decode_clock_reasons(int(mask))} \
        if _int(mask) is not None else None
    out["temperature_c"] = _int(_ask(nv, "nvmlDeviceGetTemperature", h, 0))  # NVML_TEMPERATURE_GPU
    pcie = {"gen": _int(_ask(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h)),
            "max_gen": _int(_ask(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h)),
            "width": _int(_ask(nv, "nvmlDeviceGetCurrPcieLinkWidth", h)),
            "max_width": _int(_ask(nv, "nvmlDeviceGetMaxPcieLinkWidth", h))}
    out["pcie"] = pcie if any(v is not None for v in pcie.values()) else None
    out["nvlink"] = _nvlink(nv, h)
    return out


def _nvlink(nv: Any, h: Any) -> dict[str, Any] | None:
    """Links 0.. until NVML says there is no such link: None for a GPU without NVLink (NotSupported at
    link 0, as on a PCIe card), else how many and which are down."""
    states = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))):
        state = _ask(nv, "nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            break
        states.append(int(state))
    if not states:
        return None
    return {"links": len(states), "active": sum(1 for s in states if s), "down": [i for i, s in enumerate(states)
                                                                                   if not s]}


# -- PCI bus ids --------------------------------------------------------------------------------------

_BUS = re.compile(r"^(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?$")


def bus_key(bus_id: str) -> str | None:
    """Any spelling of a GPU's PCI address -> "dddd:bb:dd" (domain, bus, device; the function dropped):
    NVML's "00000000:41:00.0", sysfs's "0000:41:00.0", an Xid's "PCI:0000:41:00" or an old driver's
    "0000:41:00" and "41:00" (domain 0). None if it is none of them."""
    m = _BUS.match(bus_id.strip())
    if m is None:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}"


# -- Xid lines ----------------------------------------------------------------------------------------

# "NVRM: Xid (PCI:0000:41:00): 79, pid=2451, name=python3, GPU has fallen off the bus." (R470 on) and
# "NVRM: Xid (0000:01:00): 13, 0005 00000000 ..." (older drivers: no "PCI:").
XID_LINE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9A-Fa-f:.]+)\): (\d+)(?:, ?(.*))?$")
_PID = re.compile(r"pid=(?:'?)(\d+)")
_NAME = re.compile(r"name=([^,]+)")


def parse_xid(message: str) -> dict[str, Any] | None:
    """One kernel message -> {"bus", "xid", "pid", "name", "text"} if it is a driver's Xid line."""
    m = XID_LINE.search(message.strip())
    if m is None:
        return None
    bus = bus_key(m.group(1))
    if bus is None:
        return None
    rest = m.group(3) or ""
    pid = _PID.search(rest)
    name = _NAME.search(rest)
    return {"bus": bus, "xid": int(m.group(2)), "pid": int(pid.group(1)) if pid else None,
            "name": name.group(1).strip() if name and "<unknown>" not in name.group(1) else None,
            "text": message.strip()[m.start():]}


def map_xids(xids: list[dict[str, Any]], buses: dict[int, str]) -> list[dict[str, Any]]:
    """Each Xid with "gpu": the NVML index whose bus id it names (None if none does). ``buses``: index
    -> its bus id in any spelling, "" for a GPU NVML could not read it of (a lost GPU answers no
    call): when exactly one GPU's bus is unknown and an Xid names a bus no known GPU has, it is that one."""
    known = {bus_key(b): i for i, b in buses.items() if b and bus_key(b)}
    unknown = [i for i, b in buses.items() if not b or not bus_key(b)]
    out = []
    for x in xids:
        gpu = known.get(x["bus"])
        if gpu is None and len(unknown) == 1:
            gpu = unknown[0]
        out.append({**x, "gpu": gpu})
    return out


# -- the kernel log -----------------------------------------------------------------------------------

_SHORT_UNIX = re.compile(r"^(\d+(?:\.\d+)?) \S+ ([^:\s]+?)(?:\[\d+\])?: (.*)$")
_DMESG = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\] (.*)$")


def parse_short_unix(line: str) -> tuple[float, str] | None:
    """``journalctl -o short-unix``: "1765103024.123456 node7 kernel: NVRM: ..." -> (time, message);
    only the kernel's lines."""
    m = _SHORT_UNIX.match(line.rstrip("\n"))
    if m is None or m.group(2) != "kernel":
        return None
    return float(m.group(1)), m.group(3)


def parse_kmsg(record: str, boot: float) -> tuple[float, str] | None:
    """A /dev/kmsg record, "6,1234,5301234567,-;NVRM: ...", -> (host time, message): its time is
    microseconds since boot."""
    head, sep, rest = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        usec = int(fields[2])
    except ValueError:
        return None
    return boot + usec / 1e6, rest.split("\n", 1)[0]


def parse_dmesg(line: str, boot: float) -> tuple[float, str] | None:
    """``dmesg``'s "[ 5301.234567] NVRM: ..." (seconds since boot) -> (host time, message)."""
    m = _DMESG.match(line.rstrip("\n"))
    if m is None:
        return None
    return boot + float(m.group(1)), m.group(2)


def boot_time() -> float:
    """The host's clock at boot as the kernel log counts it (its stamps are CLOCK_MONOTONIC-like)."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def standin_log() -> str | None:
    """The file an NVML stand-in names as its host's kernel log (the lab's), else None."""
    try:
        import pynvml
    except Exception:
        return None
    path = getattr(pynvml, "STANDIN_KERNEL_LOG", None)
    return str(path) if path else None


def _journal_has_kernel(run: Any) -> bool:
    """Whether this host's journal carries the kernel's lines for this user (a container's does not;
    a user outside the adm/systemd-journal groups sees none)."""
    try:
        res = run(["journalctl", "-k", "-b", "-q", "-n", "1", "-o", "short-unix", "--no-pager"],
                  capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0 and any(parse_short_unix(line) for line in res.stdout.splitlines())


def _read_kmsg(path: str, boot: float) -> list[tuple[float, str]]:
    """Every record /dev/kmsg still holds (OSError when this user may not read it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record overwritten while we read: the next one follows
                continue
            if not data:
                break
            got = parse_kmsg(data.decode(errors="replace"), boot)
            if got is not None:
                out.append(got)
    finally:
        os.close(fd)
    return out


def kernel_lines(since: float = 0.0, standin: str | None = None, run: Any = subprocess.run,
                 kmsg: str = "/dev/kmsg") -> tuple[str | None, str | None, list[tuple[float, str]]]:
    """(source, error, [(host time, message)]) of the kernel log since ``since`` (0: since boot)."""
    if standin:
        try:
            with open(standin, errors="replace") as f:
                lines = [p for p in (parse_short_unix(line) for line in f) if p]
        except FileNotFoundError:
            lines = []
        except OSError as exc:
            return standin, f"{standin}: {exc.strerror or exc}", []
        return standin, None, [(t, m) for t, m in lines if t >= since]
    why = []
    if _journal_has_kernel(run):
        argv = ["journalctl", "-k", "-b", "-q", "-o", "short-unix", "--no-pager"]
        if since > 0:  # whole seconds (what every journalctl takes); the lines are compared exactly below
            argv += ["--since", f"@{int(since)}"]
        try:
            res = run(argv, capture_output=True, text=True, timeout=30, check=False)
            lines = [p for p in (parse_short_unix(line) for line in res.stdout.splitlines()) if p]
            return "journal", None, [(t, m) for t, m in lines if t >= since]
        except (OSError, subprocess.SubprocessError) as exc:
            why.append(f"journalctl: {exc}")
    else:
        why.append("the journal has no kernel lines here")
    boot = boot_time()
    try:
        return "kmsg", None, [(t, m) for t, m in _read_kmsg(kmsg, boot) if t >= since]
    except OSError as exc:
        why.append(f"{kmsg}: {exc.strerror or exc}")
    try:
        res = run(["dmesg"], capture_output=True, text=True, timeout=30, check=False)
        if res.returncode == 0:
            lines = [p for p in (parse_dmesg(line, boot) for line in res.stdout.splitlines()) if p]
            return "dmesg", None, [(t, m) for t, m in lines if t >= since]
        why.append(f"dmesg: {(res.stderr or '').strip()[:120]}")
    except (OSError, subprocess.SubprocessError) as exc:
        why.append(f"dmesg: {exc}")
    return None, "no kernel log this user can read (" + "; ".join(why) + ")", []


def xids_in(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    out = []
    for at, message in lines:
        x = parse_xid(message)
        if x is not None:
            out.append({"at": at, **x})
    return out


def nvml_buses() -> dict[int, str]:
    """index -> NVML's bus id ("" where NVML cannot read it: a lost GPU), {} without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    out: dict[int, str] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId
                out[i] = bus.decode() if isinstance(bus, bytes) else str(bus)
            except Exception:
                out[i] = ""
    except Exception:
        return out
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def kernel_xids(since: float = 0.0, buses: dict[int, str] | None = None) -> dict[str, Any]:
    """The probe's answer: where the kernel log was read, why not, and its Xid lines since ``since``
    with the GPU each names."""
    answer: dict[str, Any] = kernel_xids_start(since)(buses)
    return answer


def kernel_xids_start(since: float = 0.0, timeout: float = 60.0) -> Any:
    """``kernel_xids``, begun now in a thread of its own: returns the function that waits for it and maps
    its Xids with ``buses`` (None: NVML's own). The probe starts it first and reads every other fact
    meanwhile: a long-running host's journal takes a while to read (as the GETs' answers do)."""
    import threading

    box: dict[str, Any] = {}

    def read() -> None:
        box["read"] = kernel_lines(since, standin_log())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()

    def answer(buses: dict[int, str] | None) -> dict[str, Any]:
        thread.join(timeout)
        source, error, lines = box.get("read") or (None, f"the kernel log was not read within {timeout:g} s", [])
        return {"source": source, "error": error,
                "xids": map_xids(xids_in(lines), buses if buses is not None else nvml_buses())}

    return answer


# -- following (status --watch) -------------------------------------------------------------------------

KEEPALIVE_S = 2.0  # the longest silence before a line nobody routes (a broken pipe then ends the follower)


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def follow(since: float, standin: str | None = None, kmsg: str = "/dev/kmsg") -> None:
    """Xid lines as they come, as JSON lines, until the reader goes away: first {"source"} (or
    {"error"} and the end), then {"xid": {...}} per line, {"alive": true} after KEEPALIVE_S of quiet.
    ``since`` (the host's clock; 0: from now on): the lines from then on, so a caller that read the log
    up to a moment misses none written while this started."""
    if standin:
        _emit({"source": standin})
        _follow_file(standin, since)
    elif _journal_has_kernel(subprocess.run):
        _emit({"source": "journal"})
        _follow_journal(since)
    else:
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            _emit({"error": f"no kernel log this user can follow ({kmsg}: {exc.strerror or exc}; the journal "
                            "has no kernel lines here)"})
            return
        _emit({"source": "kmsg"})
        _follow_kmsg(fd, since)


def _say_xid(at: float, message: str) -> bool:
    x = parse_xid(message)
    if x is None:
        return False
    _emit({"xid": {"at": at, **x}})
    return True


def _follow_file(path: str, since: float) -> None:
    """A file others append lines to: read what is new every 0.05 s (a Xid within a second)."""
    offset = 0
    if since <= 0:
        with contextlib.suppress(OSError):
            offset = os.path.getsize(path)
    said = time.monotonic()
    partial = ""
    while True:
        try:
            with open(path, errors="replace") as f:
                f.seek(offset)
                data = f.read()
                offset = f.tell()
        except FileNotFoundError:
            data = ""
        lines = (partial + data).split("\n")
        partial = lines.pop()
        for line in lines:
            got = parse_short_unix(line)
            if got is not None and got[0] >= since and _say_xid(*got):
                said = time.monotonic()
        if time.monotonic() - said >= KEEPALIVE_S:
            _emit({"alive": True})
            said = time.monotonic()
        time.sleep(0.05)


def _follow_journal(since: float) -> None:
    import queue
    import threading

    start = ["--since", f"@{int(since)}"] if since > 0 else ["-n", "0"]
    proc = subprocess.Popen(["journalctl", "-k", "-b", "-f", *start, "-q", "-o", "short-unix", "--no-pager"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            try:
                line = lines.get(timeout=KEEPALIVE_S)
            except queue.Empty:
                _emit({"alive": True})
                continue
            if line is None:
                _emit({"error": "journalctl -k -f ended"})
                return
            got = parse_short_unix(line)
            if got is not None and got[0] >= since:
                _say_xid(*got)
    finally:
        proc.kill()  # our own child, by its handle
        proc.wait()


def _follow_kmsg(fd: int, since: float) -> None:
    import select

    boot = boot_time()
    os.lseek(fd, 0, os.SEEK_SET if since > 0 else os.SEEK_END)  # /dev/kmsg: its oldest record, or the next
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        try:
            data = os.read(fd, 16384)  # one record per read; none waiting: BlockingIOError
        except BrokenPipeError:  # a record overwritten while we read: the next one follows
            continue
        except BlockingIOError:
            if not poller.poll(KEEPALIVE_S * 1000):
                _emit({"alive": True})
            continue
        got = parse_kmsg(data.decode(errors="replace"), boot)
        if got is not None and got[0] >= since:
            _say_xid(*got)


if __name__ == "__main__":
    command, arg = sys.argv[1], json.loads(sys.argv[2])
    if command == "follow":
        try:
            follow(float(arg.get("since") or 0.0), standin_log())
        except BrokenPipeError:  # the reader went away: nothing is left to do
            with contextlib.suppress(OSError):
                os.close(1)
