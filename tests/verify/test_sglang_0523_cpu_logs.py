"""The phase and cause tables on the real SGLang 0.5.23's own output (CPU build, the lab's tiny model).

Each case is a log recorded from the real server (tests/verify/data/sglang-0.5.23-cpu/, see its
README.md): its combined stdout and stderr, split into lines as the journal splits them. Each is
checked twice: by the cause table alone (classify, phase_of, fatal_rule), and by the health gate
itself, fed the lines (and the exit systemd reports for that exit code) by a fake supervisor, as a
deploy would see them. No engine needed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.memory.logparse import parse_memory_log
from gpudeploy.plan import load_plan
from gpudeploy.plan.flags import flag_for
from gpudeploy.progress import progress_of
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate
from gpudeploy.verify.causes import classify, fatal_rule, phase_of
from gpudeploy.verify.gate import PHASE_ORDER

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "sglang-0.5.23-cpu"
RECORDED = json.loads((DATA / "recorded.json").read_text())
# systemd's words for the main process's end, by the exit code the recording saw
EXIT_WORDS = {0: "code=exited, status=0/SUCCESS", 1: "code=exited, status=1/FAILURE",
              2: "code=exited, status=2/INVALIDARGUMENT", -9: "code=killed, status=9/KILL"}


def lines_of(case: str) -> list[str]:
    """The log as journald records it: one record per "\\n" (a tqdm bar's "\\r" updates stay in one)."""
    return (DATA / f"{case}.log").read_bytes().decode(errors="replace").split("\n")


def phases(lines: list[str]) -> list[str]:
    """The phases the gate moves through (it never goes back)."""
    seen = ["starting"]
    for line in lines:
        p = phase_of(line)
        if p and PHASE_ORDER.index(p) > PHASE_ORDER.index(seen[-1]):
            seen.append(p)
    return seen[1:]


@dataclass(frozen=True)
class Expect:
    kind: str | None           # the cause (None: no cause, the server is fine or only hangs)
    phases: tuple[str, ...]     # the phases its lines show, in order
    says: tuple[str, ...] = ()  # words the summary must have
    step: tuple[str, ...] = ()  # words the next step must have
    settings: dict[str, Any] | None = None  # the role's settings when not the lab role's


READY = ("loading weights", "allocating KV cache", "starting HTTP server", "ready")
CASES: dict[str, Expect] = {
    "normal": Expect(None, READY),
    "invalid-value": Expect("invalid-flag-value", (), ("--max-total-tokens", "Invalid integer value: 'abc'"),
                            ("role's settings",)),
    "unknown-flag": Expect("unknown-flag", (), ("unrecognized arguments: --no-such-flag 1",), ("engine_versions",)),
    # uvicorn cannot bind, says so, and the server then hangs ("Waiting for application shutdown."):
    # the fatal line alone must end the gate
    "port-in-use": Expect("port-in-use", READY[:3], ("already taken", "port ", "127.0.0.1"), ("ss -ltnp",)),
    "missing-model": Expect("model-not-found", (), ("/nonexistent/tiny-model",), ("config.json",)),
    "scheduler-killed-after-ready": Expect("worker-died", READY, ("exit code -9", "SIGKILL"), ("dmesg",)),
    "scheduler-killed-while-starting": Expect("worker-died", (), ("exit code -9",), ("dmesg",)),
    "kv-too-small": Expect("kv-pool-empty", READY[:2], ("KV cache pool came out empty",),
                           ("--max-total-tokens (now 0)",), settings={"max_total_tokens": 0, "device": "cpu"}),
    # seen in the lab as "exited (code=killed, status=9/KILL) without an error message"
    "missing-module": Expect("missing-module", (), ("`mooncake`",),
                             ("mooncake-transfer-engine-non-cuda",
                              "--disaggregation-transfer-backend (now mooncake_tcp)")),
    "sigstop-starting": Expect(None, READY[:1]),
    "kv-below-context": Expect(None, READY),
}


def test_every_recording_has_a_case() -> None:
    assert sorted(CASES) == sorted(p.stem for p in DATA.glob("*.log"))
    assert sorted(CASES) == sorted(RECORDED)


def exit_code(case: str) -> int | None:
    code = RECORDED[case].get("exit_code")
    return None if code is None or case in ("normal", "kv-below-context") else int(code)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cause_table_on_real_output(case: str) -> None:
    want = CASES[case]
    lines = lines_of(case)
    assert tuple(phases(lines)) == want.phases
    code = exit_code(case)
    settings = want.settings if want.settings is not None else lab_unit().role.settings
    cause = classify(lines, settings, lambda n: flag_for("sglang", "0.5.23", n), exited=code is not None,
                     exit_status=EXIT_WORDS.get(code, "") if code is not None else "")
    if want.kind is None:
        assert cause is None, cause and cause.render()
        assert not any(fatal_rule(line) for line in lines if "ready to roll" not in line)
        return
    assert cause is not None and cause.kind == want.kind, cause and cause.render()
    for words in want.says:
        assert words in cause.summary, cause.render()
    for words in want.step:
        assert words in cause.next_step, cause.render()
    assert cause.evidence and cause.next_step


def test_a_healthy_start_prints_no_fatal_line_until_its_shutdown() -> None:
    """Every line of a healthy 0.5.23 start, to ready and through its SIGTERM shutdown, is harmless:
    "Ignore import error ...: No module named 'cutlass'" is no missing module."""
    lines = lines_of("normal")
    assert [ln for ln in lines if fatal_rule(ln)] == []
    assert any("No module named 'cutlass'" in ln for ln in lines)


def test_memory_and_progress_lines_of_a_real_start() -> None:
    lines = lines_of("normal")
    m = parse_memory_log(lines)
    assert m.kv_tokens == 4096 and m.phase_reached == "ready" and m.failure is None
    assert m.preload_free_gib is not None and m.preload_free_gib > 1  # host RAM on CPU
    assert m.max_running_requests == 2048
    # 0.5.23's default loader: "Multi-thread loading shards", the whole bar in one record
    bar = next(ln for ln in lines if "loading shards" in ln)
    assert bar.count("\r") >= 2
    assert progress_of(bar) == ("checkpoint shards 1/1", 1.0)


# -- the gate itself, fed each recording -----------------------------------------------------------


def lab_unit() -> Any:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab-sglang.yml"), host="lab1", memory=False)
    return next(u for u in plan.units if u.role.engine == "sglang")


class _Replay:
    """A supervisor whose watch plays a recording's lines, then the exit (if the server exited)."""

    def __init__(self, unit: str, lines: list[str], exit_words: str | None) -> None:
        self.unit, self.lines, self.exit_words = unit, lines, exit_words

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        def feed() -> None:
            for line in self.lines:
                sinks[self.unit].line(line)
            if self.exit_words:
                sinks[self.unit].exited(f"Main process exited, {self.exit_words}", from_log=True)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return list(self.lines)


@pytest.mark.parametrize("case", sorted(c for c in CASES if c not in ("normal", "kv-below-context")))
def test_the_gate_on_real_output(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `invoke deploy` would print: the cause, or for a server that hangs, the timeout with the
    last phase its lines reached."""
    want = CASES[case]
    unit = lab_unit()
    if want.settings is not None:
        unit = replace(unit, role=replace(unit.role, settings=want.settings))
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: None)  # /health never answers
    code = exit_code(case)
    lines = lines_of(case)
    if case == "scheduler-killed-after-ready":  # the gate only watches until ready: the same death at start
        lines = [ln for ln in lines if "ready to roll" not in ln]
    sup = _Replay(unit.name, lines, EXIT_WORDS[code] if code is not None else None)
    results = gate.gate_runs(None, sup, [(unit, Run(unit.name, "inv", 41, 1, False))],  # type: ignore[arg-type]
                             on_phase=lambda *a: None, timeout_s=1.5,
                             flag_name=lambda u: (lambda n: flag_for("sglang", "0.5.23", n)))
    res = results[unit.name]
    assert not res.ok and res.cause is not None
    if want.kind is None:  # hangs: the timeout names the phase the last lines show
        assert res.cause.kind == "timeout"
        assert res.cause.summary.endswith(f"last phase reached: {want.phases[-1]}"), res.cause.render()
        return
    expected_phases = want.phases if case != "scheduler-killed-after-ready" else READY[:3]
    assert res.cause.kind == want.kind, res.cause.render()
    assert res.phase == (expected_phases[-1] if expected_phases else "starting")
    for words in want.says:
        assert words in res.cause.summary, res.cause.render()
