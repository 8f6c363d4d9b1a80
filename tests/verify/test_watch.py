"""`invoke status --watch` (issue 23): a death after ready shows the moment the host's one stream says
it, with its cause from the run's own lines and what to change; the light poll keeps that cause, follows
a restarted unit's new run, and says what no log says (health, the routers' workers, an unreachable
host). Everything a host would say is faked here: the probe's facts and the supervisor's stream."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.errors import HostUnreachable
from gpudeploy.plan import load_plan
from gpudeploy.report import status_text
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.supervisor.systemd import SYSTEMD
from gpudeploy.verify import watch
from gpudeploy.verify.watch import Change, Row, changes

REPO = Path(__file__).resolve().parents[2]
PLAN = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
LAB1 = PLAN.inventory.hosts["lab1"]
UNITS = [u for u in PLAN.units if u.host.name == "lab1"]
DECODE = next(u for u in UNITS if u.role.name == "decode")
ILLEGAL = ["[2026-12-01 10:00:07 TP0] Scheduler hit an exception: Traceback (most recent call last):",
           "RuntimeError: CUDA error: an illegal memory access was encountered",
           "Received sigquit from a child process. It usually means the child failed."]


def facts(*, decode: str = "active", invocation: str = "inv-1", pid: int = 41, health: int | None = 200,
          workers: Any = None) -> dict[str, Any]:
    """The host probe's answer for lab1: every unit active, decode as given."""
    units = {}
    for u in UNITS:
        state, inv, main = (decode, invocation, pid) if u is DECODE else ("active", f"inv-{u.role.name}", 7)
        props = {"Id": u.name, "LoadState": "loaded", "ActiveState": state,
                 "SubState": "running" if state == "active" else "failed", "MainPID": str(main if state == "active"
                                                                                         else 0),
                 "InvocationID": inv, "Result": "success" if state == "active" else "exit-code",
                 "ExecMainStatus": "0" if state == "active" else "1"}
        units[u.name] = {"props": props, "procs": [], "record": None, "journal": ["one line"] if state != "active"
                         else [], "meta": {"deployment": "lab", "role": u.role.name}}
    http: dict[str, Any] = {u.name: {"status": 200} for u in UNITS}
    http[DECODE.name] = {"status": health}
    router = next(u for u in UNITS if u.role.engine == "sglang_router")
    http[f"{router.name}#workers"] = {"status": 200, "json": workers if workers is not None else {"workers": []}}
    return {"systemd": True, "now": 1_000.0, "units": units, "http": http, "process_units": {}, "gpus": None}


class FakeHost:
    """What the follower reaches: probes answer from ``self.facts``; the supervisor's watch hands
    its sinks to the test, which plays the host's stream."""

    def __init__(self) -> None:
        self.facts = facts()
        self.probes: list[dict[str, Any]] = []
        self.watches: list[tuple[list[Run], int | None, float | None]] = []
        self.sinks: dict[str, Sink] = {}
        self.watching = threading.Event()
        self.down: Exception | None = None
        self.host = LAB1
        self.name = "systemd"

    # the transport
    def __enter__(self) -> FakeHost:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # the supervisor
    def states(self, f: dict[str, Any]) -> Any:
        return SYSTEMD.states(f)

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink], *, tail: int | None = None,
              poll_s: float | None = None) -> Iterator[None]:
        self.watches.append((runs, tail, poll_s))
        self.sinks = sinks
        self.watching.set()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    fake = FakeHost()

    def probe(remote: Any, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        if fake.down is not None:
            raise fake.down
        fake.probes.append(spec)
        return fake.facts

    monkeypatch.setattr(watch, "probe", probe)
    monkeypatch.setattr(watch, "connect", lambda h: fake)
    monkeypatch.setattr(watch, "for_host", lambda h, f=None: fake)
    return fake


def wait_until(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Screen(io.StringIO):
    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@contextmanager
def watching(out: Screen) -> Iterator[threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=watch.watch_status, args=(PLAN, [LAB1], (), status_text),
                         kwargs={"out": out, "stop": stop}, daemon=True)
    t.start()
    try:
        yield stop
    finally:
        stop.set()
        t.join(10)


def test_a_death_after_ready_shows_at_once_with_its_cause_and_what_to_change(host: FakeHost,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "POLL_S", 60.0)  # no poll comes: only the stream can tell
    out = Screen()
    with watching(out):
        wait_until(lambda: "watching: a death is shown at once" in out.getvalue(), 10, "the first table")
        assert host.watching.wait(5)
        [(runs, tail, poll_s)] = host.watches  # one stream for the host's three runs
        assert sorted(r.unit for r in runs) == sorted(u.name for u in UNITS)
        assert tail == 60 and poll_s == watch.STREAM_STATE_POLL_S  # the runs' last lines, not their whole logs
        sink = host.sinks[DECODE.name]
        for line in ILLEGAL:
            sink.line(line)
        died = time.monotonic()
        sink.exited("Main process exited, code=exited, status=1/FAILURE", from_log=True)
        text = wait_until(lambda: next((line for line in out.getvalue().splitlines() if "lab1/decode:" in line),
                                       None), 5, "the death")
        shown_after = time.monotonic() - died
    print(f"death -> shown after {shown_after * 1000:.0f} ms")
    assert shown_after < 1.0  # the bound; here nothing but threads stand between
    assert "active/running -> failed/failed; MainPID" not in text
    assert "lab1/decode: active/running -> failed/failed; health 200 -> down; FAILED: a CUDA illegal memory " \
           "access in the scheduler while it ran requests, so the server exited; next step: " in text, text
    assert "CUDA_LAUNCH_BLOCKING=1" in text  # what to change
    assert f"    | {ILLEGAL[1]}" in out.getvalue()  # the run's own line that shows it
    assert len(host.probes) == 1  # the death needed no probe at all


def test_the_next_poll_keeps_the_streams_cause_and_follows_a_restarted_units_new_run(host: FakeHost) -> None:
    stop = threading.Event()
    f = watch.HostFollower(LAB1, UNITS, ["lab"], "lab", lambda: None, stop)
    f.poll(host, light=False)
    assert host.probes[0]["journal_lines"] == 60 and host.probes[0]["gpus"]  # the first look is status's own
    sink = host.sinks[DECODE.name]
    for line in ILLEGAL:
        sink.line(line)
    sink.exited("Main process exited, code=exited, status=1/FAILURE", from_log=True)
    wait_until(lambda: (DECODE.name, "inv-1") in f.causes, 5, "the cause")
    host.facts = facts(decode="failed")  # the host's journal tail is 1 line: a light poll reads no more
    f.poll(host, light=True)
    assert host.probes[-1]["journal_lines"] == 1 and not host.probes[-1]["gpus"]
    assert isinstance(f.result, list)
    decode = next(s for s in f.result if s.unit == DECODE.name)
    assert decode.state == "failed/failed"
    assert (decode.last_failure or "").startswith("a CUDA illegal memory access")  # not "exited without a message"
    assert [sorted(r.unit for r in runs) for runs, _, _ in host.watches[1:]] == [
        sorted(u.name for u in UNITS if u is not DECODE)]  # the stream follows the live runs only
    host.facts = facts(invocation="inv-2", pid=77)  # someone deployed it again
    f.poll(host, light=True)
    [runs, _, _] = host.watches[-1]
    assert {r.unit: r.invocation for r in runs}[DECODE.name] == "inv-2"
    decode = next(s for s in f.result if s.unit == DECODE.name)
    assert decode.state == "active/running" and decode.main_pid == 77 and decode.last_failure is None
    f.close_stream()


def test_a_run_whose_death_no_stream_saw_gets_its_cause_from_its_last_lines_once(host: FakeHost) -> None:
    f = watch.HostFollower(LAB1, UNITS, ["lab"], "lab", lambda: None, threading.Event())
    f.poll(host, light=False)
    host.facts = facts(decode="failed", invocation="inv-9")  # restarted and died between two polls
    host.facts["units"][DECODE.name]["journal"] = ILLEGAL
    f.poll(host, light=True)
    f.poll(host, light=True)
    tails = [p for p in host.probes if p.get("units") == [DECODE.name]]
    assert len(tails) == 1 and tails[0]["journal_lines"] == 60  # read once, with status's number of lines
    decode = next(s for s in f.result if s.unit == DECODE.name)  # type: ignore[union-attr]
    assert (decode.last_failure or "").startswith("a CUDA illegal memory access")
    f.close_stream()


def test_health_workers_and_an_unreachable_host_come_with_the_poll(host: FakeHost,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "POLL_S", 0.05)
    monkeypatch.setattr(watch, "RECONNECT_S", (0.05, 0.05))
    out = Screen()
    worker = f"http://{LAB1.address}:{DECODE.ports['http']}"
    host.facts = facts(workers={"workers": [{"url": worker, "worker_type": "decode", "is_healthy": True}]})
    with watching(out):
        wait_until(lambda: "watching:" in out.getvalue(), 10, "the first table")
        host.facts = facts(health=503,
                           workers={"workers": [{"url": worker, "worker_type": "decode", "is_healthy": False}]})
        wait_until(lambda: "lab1/decode: health 200 -> 503" in out.getvalue(), 5, "the health change")
        wait_until(lambda: f"router: 1/1 workers healthy -> 0/1 workers healthy ({worker} not)" in out.getvalue(),
                   5, "the router's view")
        host.down = HostUnreachable("lab1", "the ssh connection was lost: EOF")
        wait_until(lambda: "lab1: UNREACHABLE: lab1: the ssh connection was lost: EOF" in out.getvalue(), 5,
                   "the lost host")
        host.down = None
        wait_until(lambda: "lab1: reachable again" in out.getvalue(), 5, "the host back")


def test_on_a_terminal_the_view_is_redrawn_in_place(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "POLL_S", 0.05)
    out = Screen(tty=True)
    with watching(out):
        wait_until(lambda: "DEPLOYMENT" in out.getvalue(), 10, "the first screen")
        host.facts = facts(health=503)
        wait_until(lambda: "changes:" in out.getvalue(), 5, "a change")
    screens = out.getvalue().split("\x1b[H\x1b[2J")[1:]  # each redraw clears the screen first
    assert len(screens) >= 2
    last = screens[-1]
    assert last.startswith("gpudeploy status --watch") and "DEPLOYMENT  HOST" in last
    assert "lab1/decode: health 200 -> 503" in last.split("changes:")[1]


HOSTILE = ["\x1b]0;owned\x07\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\ \x1bP+q544e\x1b\\\x9b2J\x07\b\b",
           f"\x1b]0;owned\x07\x1bP+q544e\x1b\\\x1b[3A\x1b[2K{ILLEGAL[0]}", f"\x9b31m{ILLEGAL[1]}\x1b[0m\x07\b",
           ILLEGAL[2]]


@pytest.mark.parametrize("tty", [False, True])
def test_a_servers_escape_sequences_never_reach_the_view(host: FakeHost, monkeypatch: pytest.MonkeyPatch,
                                                         tty: bool) -> None:
    # issue 43, item 13: its last lines, and an error that quotes a host, are shown as text only
    monkeypatch.setattr(watch, "POLL_S", 0.05)
    monkeypatch.setattr(watch, "RECONNECT_S", (0.05, 0.05))
    out = Screen(tty=tty)
    with watching(out):
        wait_until(lambda: "DEPLOYMENT" in out.getvalue(), 10, "the first table")
        assert host.watching.wait(5)
        sink = host.sinks[DECODE.name]
        for line in HOSTILE:
            sink.line(line)
        sink.exited("Main process exited, code=exited, status=1/FAILURE", from_log=True)
        wait_until(lambda: f"    | {ILLEGAL[1]}" in out.getvalue(), 5, "the death and its lines")
        host.down = HostUnreachable("lab1", "ssh: \x1b]0;owned\x07connect to host lab1: \x1b[1mNo route\x1b[0m")
        wait_until(lambda: "lab1: UNREACHABLE: lab1: ssh: connect to host lab1: No route" in out.getvalue(), 5,
                   "the lost host")
    text = out.getvalue().replace("\x1b[H\x1b[2J", "")  # the view's own redraw: the only escape it writes
    assert f"    | {ILLEGAL[0]}\n    | {ILLEGAL[1]}\n" in text
    assert re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text) is None, repr(text)


def test_changes_are_one_per_unit_and_say_what_moved() -> None:
    ok = Row("lab1/decode", "active/running", 41, "200", "healthy in lab1/lab-router", None)
    cases: list[tuple[dict[str, Any], dict[str, Any], list[str]]] = [
        ({"a": ok}, {"a": ok}, []),
        ({"a": ok}, {"a": Row("lab1/decode", "active/running", 42, "200", "healthy in lab1/lab-router", None)},
         ["lab1/decode: new run: MainPID 41 -> 42"]),
        ({"a": ok}, {"a": Row("lab1/decode", "active/running", 41, "200", "UNHEALTHY in lab1/lab-router", None)},
         ["lab1/decode: router: healthy in lab1/lab-router -> UNHEALTHY in lab1/lab-router"]),
        ({}, {"a": ok}, ["lab1/decode: appeared: active/running, health 200"]),
        ({"a": ok}, {}, ["lab1/decode: gone (was active/running)"]),
        ({"lab2": "lab2: no route"}, {}, ["lab2: no longer looked at"]),
        ({"a": ok}, {"a": Row("lab1/decode", "active/running", 41, "200", "healthy in lab1/lab-router", None,
                              group_down="rank 1 on lab2: failed")},
         ["lab1/decode: its group is down: rank 1 on lab2: failed"]),
    ]
    for before, after, want in cases:
        assert [f"{c.name}: {c.text}" for c in changes(before, after, 0.0)] == want, (before, after)
    assert Change(0.0, "lab1/decode", "x", ("a line",)).render().endswith("lab1/decode: x\n    | a line")


def test_a_clean_exit_is_no_failure() -> None:
    assert watch.exit_ok("Main process exited, code=exited, status=0/SUCCESS")
    assert watch.exit_ok("Main process exited, code=exited, status=0")
    assert not watch.exit_ok("Main process exited, code=exited, status=1/FAILURE")
    assert not watch.exit_ok("Main process exited, code=killed, status=9/KILL")
    assert not watch.exit_ok("Main process exited, code=exited, status=10")
    # a stop (a deploy's restart, a teardown): systemd says only this; the process supervisor says ", stopped"
    assert watch.exit_ok("gpudeploy-lab.decode.service: Deactivated successfully.")
    assert watch.exit_ok("Main process exited, code=killed, status=TERM, stopped")
    assert not watch.exit_ok("gpudeploy-lab.decode.service: Failed with result 'signal'.")


LOCAL_INVENTORY = """
deployment: t
roles_dir: roles
hosts:
  here:
    address: 127.0.0.1
    connection: local
    supervisor: process
    numa_nodes: [{gpus: [], cpus: "0"}]
    roles: [web]
"""


def test_ctrl_c_ends_the_watch_with_130_through_the_command(tmp_path: Path) -> None:
    # A real `invoke status --watch` of this machine (connection: local, nothing deployed: it only reads)
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "web.yml").write_text('engine: command\ngpus: 0\nargv: ["/bin/true", "{{ port }}"]\n')
    inv = tmp_path / "hosts.yml"
    inv.write_text(LOCAL_INVENTORY)
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status", "--watch",
                             "--inventory", str(inv)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("watching:"):
                break
        assert re.search(r"^t +here +web +not deployed", "".join(seen), re.M), seen  # status's own table first
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed assertion must not leave the watch running
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (rest, err)
    assert "stopped watching (Ctrl-C); the watch changed nothing on the hosts" in rest
    assert "gpudeploy: interrupted" in err and "Traceback" not in err, err


def test_watch_and_json_do_not_go_together(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status", "--watch", "--json",
                          "--inventory", str(REPO / "lab" / "inventory" / "lab.yml")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert "gpudeploy: --watch is a live view and --json one document: use one of them" in res.stderr


def test_ctrl_c_that_reached_the_cancel_first_still_ends_the_watch_as_interrupted(
        host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C's listener sets every Cancel (so the watch's stop) and may do so before the main
    # thread's KeyboardInterrupt: the loop then ends by itself, and must still say so and raise.
    from gpudeploy import interrupt
    monkeypatch.setattr(interrupt, "_pressed_at", time.monotonic())
    stop = threading.Event()
    stop.set()
    out = Screen()
    with pytest.raises(KeyboardInterrupt):
        watch.watch_status(PLAN, [LAB1], (), status_text, out=out, stop=stop)
    assert "stopped watching (Ctrl-C); the watch changed nothing on the hosts" in out.getvalue()


class FakeKernel:
    """The kernel-log follower (verify/kernel_watch.py): the test plays the host's kernel."""

    started: list[FakeKernel] = []  # noqa: RUF012

    def __init__(self, remote: Any, since: float, on_xid: Any, on_error: Any) -> None:
        self.on_xid = on_xid
        self.closed = False
        FakeKernel.started.append(self)

    def close(self) -> None:
        self.closed = True


def test_a_new_xid_on_a_serving_units_gpu_shows_within_a_second(host: FakeHost,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49: an Xid 48 after ready is named in `status --watch` within a second of the kernel line, on
    the unit whose GPU it is, with the kernel's own line; nothing but the kernel log could tell."""
    monkeypatch.setattr(watch, "POLL_S", 60.0)
    monkeypatch.setattr(watch, "KernelWatch", FakeKernel)
    FakeKernel.started.clear()
    host.facts = {**facts(), "gpus": {"devices": [{"index": g, "bus_id": f"00000000:{0x41 + g:02X}:00.0",
                                                   "used": 2**30, "total": 96 * 2**30,
                                                   "health": {"lost": False, "reset_required": False}}
                                                  for g in range(8)], "processes": []},
                  "xids": {"source": "journal", "error": None, "xids": []}}
    out = Screen()
    with watching(out):
        wait_until(lambda: "watching: a death is shown at once" in out.getvalue(), 10, "the first table")
        kernel = wait_until(lambda: FakeKernel.started[-1] if FakeKernel.started else None, 5, "the kernel follower")
        assert host.probes[0]["xids"] == {"since": 0}
        logged = time.time()
        kernel.on_xid({"at": logged, "bus": "0000:45:00", "xid": 48, "pid": 9, "name": "python3",
                       "text": "NVRM: Xid (PCI:0000:45:00): 48, pid=9, name=python3, DBE"})
        said = time.monotonic()
        text = wait_until(lambda: next((line for line in out.getvalue().splitlines() if "GPU FAULT" in line), None),
                          5, "the Xid")
        shown_after = time.monotonic() - said
    assert shown_after < 1.0, shown_after
    assert text.split(" ", 1)[1].startswith("lab1/decode: GPU FAULT: GPU 4 (0000:45:00.0) reported Xid 48, an "
                                            "uncorrectable double-bit ECC memory error, at "), text
    assert "a hardware fault; next step: reset the GPU" in text and "GPUs 4-7 ok -> 4 failing, 5-7 ok" in text
    assert "    | " in out.getvalue() and "kernel: NVRM: Xid (PCI:0000:45:00): 48, pid=9, name=python3, DBE" \
        in out.getvalue()
    assert "lab1/prefill" not in out.getvalue().split("watching: a death is shown at once", 1)[1]  # not its GPU
    assert FakeKernel.started[-1].closed  # the follower ends with the watch
