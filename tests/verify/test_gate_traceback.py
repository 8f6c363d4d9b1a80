"""A fatal line that opens a traceback is explained by the traceback's last line: the gate names the
cause from the whole traceback, also when the log brings the rest late (journald stores a traceback
one entry per line, and on a loaded machine a follower read the head 0.4 s before the rest: the
loaded suite's mamba-oom case was named "the scheduler raised an exception" instead of the mamba
state that did not fit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudeploy.plan import load_plan
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate

REPO = Path(__file__).resolve().parents[2]
HEAD = "[2026-12-02 04:06:20 TP0] Scheduler hit an exception: Traceback (most recent call last):"
SITE = "/venv/lib/python3.11/site-packages/sglang/srt"
REST = [f'  File "{SITE}/managers/scheduler.py", line 3052, in run_scheduler_process',
        "    scheduler = Scheduler(server_args, port_args)",
        "[2026-12-02 04:06:20 TP1] KV Cache is allocated. dtype: torch.float16, #tokens: 1209192",  # another rank's
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Lower "
        "--max-running-requests or --max-mamba-cache-size."]


class _Late:
    """The head at once; the rest of the traceback ``late_s`` later by the stream, or only in the
    journal (``run_lines``) while the state poll reports the death."""

    def __init__(self, late_s: float, poll_first: bool) -> None:
        self.late_s, self.poll_first = late_s, poll_first

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        sink = sinks[runs[0].unit]
        later = threading.Event()

        def feed() -> None:
            sink.line(HEAD)
            if self.poll_first:  # the death comes from the state poll; the stream has only the head
                sink.exited("Main process exited, status=9, result=signal", from_log=False)
                return
            later.wait(self.late_s)  # the stream's lag being modelled, not a wait for a condition
            for line in REST:
                sink.line(line)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return [HEAD, *REST]


def gate_one(supervisor: Any) -> gate.GateResult:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    unit = next(u for u in plan.units if u.role.name == "decode")
    results = gate.gate_runs(None, supervisor, [(unit, Run(unit.name, "inv", 42, 1, False))],  # type: ignore[arg-type]
                             on_phase=lambda *a: None, flag_name=lambda u: (lambda n: "--" + n.replace("_", "-")),
                             timeout_s=30)
    return results[unit.name]


def test_the_cause_waits_for_the_end_of_the_traceback() -> None:
    res = gate_one(_Late(late_s=1.0, poll_first=False))
    assert not res.ok and res.cause is not None
    assert res.cause.kind == "mamba-state-does-not-fit", res.cause


def test_a_death_the_state_poll_saw_first_is_explained_by_the_whole_run_log() -> None:
    res = gate_one(_Late(late_s=0.0, poll_first=True))
    assert not res.ok and res.cause is not None
    assert res.cause.kind == "mamba-state-does-not-fit", res.cause


class _DiedInCapture:
    """The stream brought the run up to its KV cache; the CUDA-graph capture and its OOM are only in
    the journal when the state poll reports the death (a loaded run's canary said "allocating KV
    cache" for a server that died capturing CUDA graphs)."""

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        sink = sinks[runs[0].unit]
        threading.Thread(target=lambda: (sink.line(KV), sink.exited(
            "Main process exited, status=1/FAILURE", from_log=False)), daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return [KV, "[2026-12-05 06:20:01 TP0] Capture cuda graph begin. This can take up to several minutes.",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]


KV = "[2026-12-05 06:20:00 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1209192"


def test_a_death_the_state_poll_saw_first_reports_the_phase_its_whole_log_reached() -> None:
    res = gate_one(_DiedInCapture())
    assert not res.ok and res.phase == "capturing CUDA graphs", res
