"""The systemd supervisor's journal routing, on recorded journalctl -o json entries (no hosts)."""

from __future__ import annotations

from gpudeploy.supervisor.base import Run
from gpudeploy.supervisor.systemd import Watch, journal_argv, message_text, parse_states, route

A = Run("gpudeploy-lab.decode.service", "new-invocation", 100, start_us=2_000_000, restarted=False)
B = Run("gpudeploy-lab.prefill.service", "prefill-invocation", 101, start_us=2_000_000, restarted=False)
RUNS = {A.unit: A, B.unit: B}


def test_lines_and_exits_of_earlier_runs_are_never_taken_for_this_one() -> None:
    old_exit = {"UNIT": A.unit, "MESSAGE": "Main process exited, code=exited, status=1/FAILURE",
                "__REALTIME_TIMESTAMP": "1000000"}
    other_run = {**old_exit, "INVOCATION_ID": "old-invocation", "__REALTIME_TIMESTAMP": "3000000"}
    stale_line = {"_SYSTEMD_INVOCATION_ID": "old-invocation",
                  "MESSAGE": "Capture cuda graph failed: CUDA out of memory"}
    assert [route(e, RUNS) for e in (old_exit, other_run, stale_line)] == [None, None, None]
    assert route({**old_exit, "__REALTIME_TIMESTAMP": "2500000"}, RUNS) == (A.unit, "exit", old_exit["MESSAGE"])
    assert route({**other_run, "INVOCATION_ID": A.invocation}, RUNS) == (A.unit, "exit", old_exit["MESSAGE"])


def test_each_runs_lines_go_to_that_run() -> None:
    assert route({"_SYSTEMD_INVOCATION_ID": B.invocation, "MESSAGE": "Load weight begin."}, RUNS) == \
        (B.unit, "line", "Load weight begin.")
    assert route({"_SYSTEMD_INVOCATION_ID": A.invocation, "MESSAGE": "x"}, RUNS) == (A.unit, "line", "x")


def test_null_binary_and_long_messages_do_not_break_the_reader() -> None:
    # Without --all journalctl sends fields over 4096 bytes as null; a null systemd message used
    # to raise TypeError in the reader thread, which then saw nothing more of the run.
    assert route({"UNIT": A.unit, "MESSAGE": None, "__REALTIME_TIMESTAMP": "2500000"}, RUNS) is None
    assert route({"_SYSTEMD_INVOCATION_ID": A.invocation, "MESSAGE": None}, RUNS) == (A.unit, "line", "")
    assert message_text({"MESSAGE": [104, 105, 255]}) == "hi\ufffd"
    long = "x" * 10_000 + " Capture cuda graph failed: CUDA out of memory"
    assert route({"_SYSTEMD_INVOCATION_ID": A.invocation, "MESSAGE": long}, RUNS) == (A.unit, "line", long)
    assert "--all" in journal_argv([A, B])


def test_one_stream_follows_every_run() -> None:
    argv = journal_argv([A, B])
    assert argv.count("-f") == 1 and argv.count("+") == 1
    plus = argv.index("+")
    assert argv[plus - 2:plus] == [f"_SYSTEMD_INVOCATION_ID={A.invocation}", f"_SYSTEMD_INVOCATION_ID={B.invocation}"]
    assert argv[plus + 1:] == [f"UNIT={A.unit}", f"UNIT={B.unit}"]


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def line(self, text: str) -> None:
        self.events.append(("line", text))

    def exited(self, words: str, *, from_log: bool) -> None:
        self.events.append(("exit" if from_log else "state-exit", words))

    def lost(self, reason: str) -> None:
        self.events.append(("lost", reason))


def test_watch_delivers_multi_line_messages_line_by_line() -> None:
    sinks = {A.unit: _Sink(), B.unit: _Sink()}
    watch = Watch(remote=None, runs=[A, B], sinks=sinks)  # type: ignore[arg-type]
    watch._deliver({"_SYSTEMD_INVOCATION_ID": A.invocation, "MESSAGE": "Traceback\n  File x\nOSError: boom"})
    watch._deliver({"UNIT": B.unit, "INVOCATION_ID": B.invocation, "MESSAGE": "Failed with result 'exit-code'."})
    watch._deliver({"UNIT": B.unit, "MESSAGE": None})
    assert sinks[A.unit].events == [("line", "Traceback"), ("line", "  File x"), ("line", "OSError: boom")]
    assert sinks[B.unit].events == [("exit", "Failed with result 'exit-code'.")]


def test_state_blocks_are_split_by_unit() -> None:
    text = (f"Id={A.unit}\nActiveState=failed\nInvocationID={A.invocation}\n\n"
            f"Id={B.unit}\nActiveState=activating\nInvocationID={B.invocation}\n")
    states = parse_states(text)
    assert states[A.unit]["ActiveState"] == "failed" and states[B.unit]["ActiveState"] == "activating"


def test_a_watch_with_a_tail_asks_journalctl_for_the_last_entries_not_the_first() -> None:
    # status --watch follows servers that ran for days: their whole journal must not be replayed
    assert journal_argv([A])[:7] == ["journalctl", "-f", "-o", "json", "--all", "--no-tail", "--no-pager"]
    argv = journal_argv([A], tail=60)
    assert argv[:8] == ["journalctl", "-f", "-o", "json", "--all", "-n", "60", "--no-pager"]
    assert "--no-tail" not in argv and f"_SYSTEMD_INVOCATION_ID={A.invocation}" in argv
