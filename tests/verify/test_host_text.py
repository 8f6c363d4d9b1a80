"""A server's words reach the terminal printable (issue 43, item 13): its log lines, its errors, its
processes' command lines and stacks carry no escape sequence or control character that would drive
the user's terminal (set its title, hide a link, clear the screen, move the cursor over gpudeploy's
own lines, ring the bell, or have it answer a DCS by typing into the shell)."""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy import fanout
from gpudeploy.cli.args import user_errors
from gpudeploy.controlchars import printable
from gpudeploy.errors import RemoteError
from gpudeploy.plan import load_plan
from gpudeploy.report import status_text
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate, logs, stacks, status

REPO = Path(__file__).resolve().parents[2]
PLAN = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
DECODE = next(u for u in PLAN.units if u.role.name == "decode")
FATAL = "RuntimeError: CUDA error: an illegal memory access was encountered"

# (what a hostile server prints, what the user should see of it)
HOSTILE: list[tuple[str, str]] = [
    ("\x1b]0;you have been owned\x07title", "title"),  # OSC 0: the window title, BEL-terminated
    ("\x1b]2;title\x1b\\ST-terminated", "ST-terminated"),
    ("\x1b]8;;https://evil.example/\x1b\\https://docs.example/\x1b]8;;\x1b\\ is the link",  # OSC 8 hyperlink
     "https://docs.example/ is the link"),
    ("\x1bP+q544e\x1b\\after a DCS", "after a DCS"),  # XTGETTCAP: the terminal answers on the shell's input
    ("\x1b_an APC\x1b\\\x1b^a PM\x1b\\\x1bXan SOS\x1b\\text", "text"),
    ("\x9b2J8-bit CSI \x9b31mred", "8-bit CSI red"),  # C1 CSI: clear screen, colour
    ("\x9d0;8-bit OSC\x9cand C1 \x85NEL", "and C1 NEL"),
    ("\x1b[2J\x1b[Hcleared", "cleared"),  # clear screen, cursor home
    ("\x1b[3A\x1b[10D\x1b[Kmoved over earlier lines", "moved over earlier lines"),
    ("\x1b[38;2;255;0;0mtruecolour\x1b[0m \x1b[1;31mbold red\x1b[m", "truecolour bold red"),
    ("\x1bcreset, \x1b7saved\x1b8, \x1b(Bcharset", "reset, saved, charset"),  # two-byte escapes
    ("bell\x07\x07", "bell"),
    ("rm -rf /\b\b\b\b\b\b\b\bls -l   ", "rm -rf /ls -l   "),  # backspaces shown as nothing, not applied
    ("secret\x1b]0;unterminated", "secret"),  # an unterminated string: swallowed to the line's end
    ("NUL\x00 DEL\x7f VT\x0b FF\x0c", "NUL DEL VT FF"),
    ("tab\tkept, unicode kept: é ✓ █", "tab\tkept, unicode kept: é ✓ █"),
    # a bar redrawn with \r (tqdm): what the terminal shows, and never over gpudeploy's prefix
    ("\rLoading 0%\rLoading 100%\r\n", "Loading 100%"),
    ("[lab2/decode] READY\x1b[1G\x1b[2K[lab1/decode] READY", "[lab2/decode] READY[lab1/decode] READY"),
]
ONE_LINE = [(line, shown) for line, shown in HOSTILE if "\n" not in line]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # anything but tab and newline


def assert_printable(text: str) -> None:
    found = CONTROL.search(text)
    assert found is None, f"{found.group()!r} at {found.start()} in {text!r}"


@pytest.mark.parametrize(("line", "shown"), HOSTILE)
def test_a_hostile_line_is_shown_as_text_only(line: str, shown: str) -> None:
    assert printable(line) == shown
    assert printable(shown) == shown  # and nothing more is taken from an honest line


def test_several_lines_keep_their_newlines_and_one_line_stays_one() -> None:
    text = "\n".join(line for line, _ in ONE_LINE)
    assert printable(text, lines=True).split("\n") == [shown for _, shown in ONE_LINE]
    assert printable("one\ntwo\x1b[2A") == "one two"  # a line shown after a prefix cannot start another


# -- deploy: the gate's lines and its cause --------------------------------------------------------

class _Hostile:
    """A server that dies printing hostile lines: through the stream, or only in the journal (the
    state poll saw the death first, and the gate reads the run's lines itself)."""

    def __init__(self, via_stream: bool) -> None:
        self.via_stream = via_stream
        self.lines = [line for line, _ in HOSTILE] + [f"\x1b]0;pwned\x07\x1b[31m{FATAL}\x1b[0m\x07"]

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        sink = sinks[runs[0].unit]

        def feed() -> None:
            for line in self.lines if self.via_stream else []:
                sink.line(line)
            sink.exited("Main process exited, code=exited, status=1/FAILURE", from_log=self.via_stream)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return self.lines


@pytest.mark.parametrize("via_stream", [True, False])
def test_the_gate_keeps_and_reports_a_dying_servers_lines_printable(via_stream: bool) -> None:
    results = gate.gate_runs(None, _Hostile(via_stream), [(DECODE, Run(DECODE.name, "inv", 42, 1, False))],  # type: ignore[arg-type]
                             on_phase=lambda *a: None, flag_name=lambda u: (lambda n: "--" + n.replace("_", "-")),
                             timeout_s=30)
    res = results[DECODE.name]
    assert not res.ok and res.cause is not None
    assert res.cause.kind == "cuda-illegal-memory-access", res.cause  # found through the escapes
    assert FATAL in res.cause.evidence
    for text in [*res.lines, *res.cause.evidence, res.cause.summary]:
        assert_printable(text)
    assert res.lines[:len(HOSTILE)] == [shown for _, shown in HOSTILE]


def test_what_deploy_says_is_printable_whoever_built_it(capsys: pytest.CaptureFixture[str]) -> None:
    fanout.say("[lab1/decode] FAILED: " + HOSTILE[0][0] + "\n    | " + HOSTILE[5][0])
    assert capsys.readouterr().out == "[lab1/decode] FAILED: title\n    | 8-bit CSI red\n"


def test_an_error_that_quotes_a_hosts_stderr_is_printable() -> None:
    @user_errors
    def task() -> None:
        raise RemoteError("lab1", "systemctl failed: \x1b]0;owned\x07Unit \x1b[1mx\x1b[0m not found\x07")

    with pytest.raises(Exception) as exc:
        task()
    assert str(exc.value.message) == "gpudeploy: lab1: systemctl failed: Unit x not found"  # type: ignore[attr-defined]


def test_a_stalled_servers_stacks_are_printable() -> None:
    doc = {"py_spy": "/venv/bin/py-spy", "stacks": [
        {"pid": 41, "error": "\x1b[2J",
         "text": "Thread 41 (idle): \x1b]0;owned\x07\"MainThread\"\n    wait (\x1b[31mthreading.py\x1b[0m:320)\x07"}]}
    found = stacks.parse(doc, [{"pid": 41, "start_ticks": 1, "cmd": "python -m sglang\x1b]0;x\x07 --port 1"}], 1, None)
    [stack] = found.stacks
    assert stack.text == 'Thread 41 (idle): "MainThread"\n    wait (threading.py:320)'
    assert (stack.cmd, stack.error) == ("python -m sglang --port 1", "")


# -- status, and invoke logs -----------------------------------------------------------------------

def test_status_shows_a_failed_runs_last_lines_printable() -> None:
    lines = [line for line, _ in HOSTILE] + [f"\x1b]0;pwned\x07{FATAL}"]
    props = {"Id": DECODE.name, "LoadState": "loaded", "ActiveState": "failed", "SubState": "failed",
             "MainPID": "0", "InvocationID": "inv-1", "Result": "exit-code", "ExecMainStatus": "1"}
    facts = {"systemd": True, "now": 1_000.0, "http": {}, "process_units": {}, "gpus": None,
             "units": {DECODE.name: {"props": props, "procs": [{"pid": 7, "cmd": "python\x1b]0;x\x07 -m sglang"}],
                                     "record": None, "journal": lines, "meta": {"deployment": "lab"}}}}
    [(s, _)] = status.read_facts(DECODE.host, [DECODE], facts, "lab")
    assert (s.last_failure or "").startswith("a CUDA illegal memory access") and FATAL in s.failure_lines
    text, ok = status_text({"lab1": [s]})
    assert not ok and "lab1/decode: last failure: a CUDA illegal memory access" in text
    assert_printable(text)


def test_invoke_logs_prints_each_line_printable_even_cut_between_reads() -> None:
    data = ("é \x1b]0;owned\x07first\n" + "".join(line + "\n" for line, _ in ONE_LINE) + "last, unended"
            ).encode()
    for size in (1, 2, 3, 7, len(data)):  # an escape sequence, a UTF-8 character, a line cut anywhere
        chunks = iter([data[i:i + size] for i in range(0, len(data), size)] + [b""])
        out = io.StringIO()
        logs.copy_lines(lambda n, chunks=chunks: next(chunks), out)
        assert out.getvalue().split("\n") == ["é first", *(shown for _, shown in ONE_LINE), "last, unended", ""], size
