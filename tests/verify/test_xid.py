"""The driver's Xids as a unit's cause (verify/xid.py): the table, the sentence that names the GPU, and
deploy naming a hardware fault before the engine's own words when an engine dies while it starts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.plan import load_plan
from gpudeploy.remote.base import Result
from gpudeploy.supervisor import systemd
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import xid
from gpudeploy.verify.causes import Cause

REPO = Path(__file__).resolve().parents[2]
# 12:03:44 today on this machine's clock (the sentence shows the host's time in the local zone)
AT = time.mktime((*time.localtime()[:3], 12, 3, 44, 0, 0, -1))
FELL = {"at": AT, "bus": "0000:41:00", "gpu": 3, "xid": 79, "pid": None, "name": None,
        "text": "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus."}


def test_the_table_knows_the_xids_the_field_meets() -> None:
    wanted = {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 136, 140, 143, 154}
    assert wanted <= set(xid.XIDS)
    assert all(x.nvidia and x.bucket and x.words and x.todo for x in xid.XIDS.values())
    assert xid.XIDS[79].nvidia == "GPU has fallen off the bus" and xid.XIDS[79].bucket == "RESTART_BM"
    assert xid.XIDS[95].bucket == "RESET_GPU" and xid.XIDS[94].bucket == "RESTART_APP"  # NVIDIA's catalog
    assert xid.describe(999).words == "an Xid gpudeploy's table does not list"
    assert xid.NVIDIA_CATALOG in xid.describe(999).todo


def test_a_hardware_xid_is_named_first_with_what_to_do_and_nothing_to_change() -> None:
    engine = Cause("nccl-error", "NCCL failed between the TP workers", ("ncclUnhandledCudaError",), "check NCCL_*")
    c = xid.cause([FELL], engine)
    assert c is not None and c.kind == "gpu-xid"
    assert c.summary == ("GPU 3 (0000:41:00.0) reported Xid 79, fell off the bus, at 12:03:44: a hardware fault "
                         "(the engine said: NCCL failed between the TP workers)")
    assert c.next_step == ("reset the GPU or drain the node (NVIDIA: reboot the machine); if it repeats, check the "
                           "GPU, its slot and its power; nothing to change in the settings")
    assert c.evidence == ("12:03:44 kernel: NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.",
                          "ncclUnhandledCudaError")
    assert c.extra["engine_cause"] == "nccl-error"


def test_an_applications_own_fault_is_named_but_the_engines_step_stands() -> None:
    fault = {**FELL, "xid": 31, "text": "NVRM: Xid (PCI:0000:41:00): 31, pid=7, name=python3, Ch 0000000b"}
    engine = Cause("cuda-illegal-memory-access", "a CUDA illegal memory access", (),
                   "rerun with CUDA_LAUNCH_BLOCKING=1")
    c = xid.cause([fault], engine)
    assert c is not None
    assert c.summary.startswith("GPU 3 (0000:41:00.0) reported Xid 31, a GPU memory page fault (an illegal memory "
                                "access, usually the application's), at 12:03:44: the driver's report of an "
                                "application's fault")
    assert c.next_step == "rerun with CUDA_LAUNCH_BLOCKING=1"
    # beside a hardware fault, the hardware one leads
    both = xid.cause([fault, {**FELL, "at": AT + 1}], engine)
    assert both is not None and both.summary.startswith("GPU 3 (0000:41:00.0) reported Xid 79")
    assert "; also GPU 3 (0000:41:00.0) reported Xid 31" in both.summary


def test_xid_154_says_what_the_gpu_now_needs() -> None:
    x = {**FELL, "xid": 154, "text": "NVRM: Xid (PCI:0000:41:00): 154, GPU recovery action changed from 0x0 (None) "
                                     "to 0x4 (Drain and Reset)"}
    assert xid.sentence(x) == ("GPU 3 (0000:41:00.0) reported Xid 154, the GPU now needs: Drain and Reset, at "
                               "12:03:44: the driver's note")


def test_only_the_xids_of_the_units_gpus_since_its_start_count() -> None:
    xids = [{**FELL, "at": AT - 60}, {**FELL, "gpu": 5}, {**FELL, "gpu": None, "bus": "0000:99:00", "at": AT + 1},
            FELL]
    assert xid.on_gpus(xids, [2, 3], AT) == [FELL, xids[2]]  # an Xid of no GPU NVML reads counts: never hidden
    assert xid.cause([], None) is None


def test_how_an_xid_while_serving_judges_the_gpu() -> None:
    assert [xid.xid_word(c) for c in (79, 48, 95, 119, 92, 63, 31, 43, 154, 999)] == [
        "lost", "failing", "failing", "failing", "degraded", "degraded", "ok", "ok", "ok", "failing"]
    healthy = {"index": 3, "health": {"lost": False, "reset_required": False}}
    assert xid.gpu_word(healthy) == "ok" and xid.gpu_word(healthy, [{**FELL, "xid": 48}]) == "failing"
    assert xid.gpu_word({"index": 3}) == "-" and xid.gpu_word({"index": 3}, [FELL]) == "lost"


def test_the_troubleshooting_page_lists_each_xid_of_the_table() -> None:
    page = (REPO / "docs" / "troubleshooting-xid.md").read_text()
    listed = [line for line in page.splitlines() if line.startswith("- **Xid ")]
    assert listed == xid.doc_lines()


# -- deploy: a death while it starts, with an Xid on its GPU --------------------------------------------------


def _unit() -> Any:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    return next(u for u in plan.units if u.role.name == "prefill")  # GPUs 0-3


class _Dies:
    """A supervisor whose watch says the run died without a word, as an engine whose GPU fell off."""

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        def feed() -> None:
            for r in runs:
                sinks[r.unit].line("[2026-12-07 12:03:44 TP0] Load weight begin. avail mem=78.50 GB")
                sinks[r.unit].exited("Main process exited, code=killed, status=9/KILL", from_log=True)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []


class _Host:
    """lab1: its probe answers the Xids given (the host's kernel log since the spec's time)."""

    def __init__(self, xids: list[dict[str, Any]]) -> None:
        self.host = type("H", (), {"name": "lab1", "python": "python3"})()
        self.xids = xids
        self.asked: list[float] = []

    def put(self, path: str, data: bytes, mode: int) -> None:
        return None

    def run(self, argv: list[str], stdin: bytes | None = None, **kw: Any) -> Result:
        spec = json.loads(argv[3])
        self.asked.append(spec["xids"]["since"])
        since = spec["xids"]["since"]
        return Result(0, json.dumps({"xids": {"source": "journal", "error": None,
                                              "xids": [x for x in self.xids if x["at"] >= since]}}), "")


def _deploy(host: _Host, monkeypatch: pytest.MonkeyPatch, started_at: float) -> Any:
    u = _unit()
    monkeypatch.setattr(systemd, "restart", lambda remote, unit, **kw: Run(unit, "inv", 42, int(started_at * 1e6),
                                                                             False))
    monkeypatch.setattr(systemd.SYSTEMD, "watch", lambda *a, **kw: _Dies().watch(*a[:3]))
    states = systemd.SYSTEMD.states({"units": {u.name: {"props": {"ActiveState": "inactive", "LoadState": "loaded"}}}})
    [out] = d.start_and_gate(host, systemd.SYSTEMD, [u], {u.name: {u.unit_path: (b"x", 0o644)}},  # type: ignore[arg-type]
                             states, d.Options(timeout_s=20), None)
    return out


def test_an_engine_that_dies_after_its_gpu_fell_off_is_named_by_the_xid(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "the server exited (code=killed, status=9/KILL) without an error message" and the advice to
    check dmesg for the OOM killer; the Xid in the kernel log was never read."""
    host = _Host([{**FELL, "gpu": 2, "bus": "0000:43:00",
                   "text": "NVRM: Xid (PCI:0000:43:00): 79, GPU has fallen off the bus."}])
    out = _deploy(host, monkeypatch, started_at=AT - 5)
    assert not out.ok and out.gate.cause.kind == "gpu-xid"
    assert out.gate.cause.summary.startswith("GPU 2 (0000:43:00.0) reported Xid 79, fell off the bus, at 12:03:44: "
                                             "a hardware fault (the engine said: the server exited")
    assert out.gate.cause.next_step.endswith("nothing to change in the settings")
    said = capsys.readouterr().out
    assert "[lab1/prefill] FAILED after" in said and "GPU 2 (0000:43:00.0) reported Xid 79" in said
    assert host.asked == [AT - 5]  # since the run's start, by the host's clock


def test_an_xid_before_the_run_or_on_another_gpu_is_not_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _Host([{**FELL, "at": AT - 600, "gpu": 1}, {**FELL, "gpu": 6, "bus": "0000:47:00"}])
    out = _deploy(host, monkeypatch, started_at=AT - 5)
    assert out.gate.cause.kind == "exited-without-message"
