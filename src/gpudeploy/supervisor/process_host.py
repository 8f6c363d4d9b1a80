"""Runs ON a host without systemd (sent as ``python3 -c``): start, stop, watch and read the runs of
gpudeploy's process supervisor. Stdlib only; never finds a process by name.

A unit is a spec file ``/etc/gpudeploy/units/<unit>.json`` (argv, env file, working directory,
stop timeout, CPUs, limits, and the deployment/role/kind it belongs to). A run of it:

  * ``start``: a monitor process (its own session, detached from our ssh) forks the server; the
    server calls setsid, so it leads its own session and process group, stdin is /dev/null and
    stdout+stderr go to a log file of this run only (``/var/log/gpudeploy/<unit>/<run>.log``). The
    monitor waits for it and writes its exit status; the run file ``/run/gpudeploy/units/<unit>.json``
    names the run, the server's PID and its start time (field 22 of /proc/PID/stat), so a reused PID
    is never taken for it.
  * ``stop``: SIGTERM to the server's process group, SIGKILL to it after the stop timeout, then
    SIGKILL to every process still in the server's session or descended from it, and to the PIDs
    recorded at gate time (workers that setsid away), each by PID and start time.
  * ``watch``: one stream of JSON lines for several runs: each run's log lines from the start of
    its log (or from about its last ``tail`` lines), and its exit (with the status the monitor saw);
    a keepalive line when it has said nothing for a while, so it ends (on EPIPE) soon after the
    reader went away instead of lingering beside a quiet server.

Usage: python3 -c SOURCE start|stop|watch|logs JSON
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from typing import Any

UNITS_DIR = "/etc/gpudeploy/units"
RUNS_DIR = "/run/gpudeploy/units"
LOG_DIR = "/var/log/gpudeploy"
RECORDS_DIR = "/var/lib/gpudeploy/runs"  # deploy's run records (apply/deploy.py RUNS_DIR): PIDs seen at gate time
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A log "line" without a newline (tqdm's progress bars redraw with \r only) is cut into pieces of at
# most this many bytes, as journald cuts at its LineMax= (48K by default): never kept whole in memory.
MAX_LINE = 48 * 1024
KEEPALIVE_S = 2.0  # watch: the longest silence before it writes a line nobody routes (a broken pipe ends it)
TAIL_BYTES = 256 * 1024  # watch with a tail: how far back from a log's end its last lines are looked for


def stat_of(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    return {"pid": pid, "state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "sid": int(rest[3]),
            "start_ticks": int(rest[19])}


def alive(pid: int, start_ticks: int) -> bool:
    st = stat_of(pid)
    return st is not None and st["start_ticks"] == start_ticks and st["state"] != "Z"


def all_stats() -> list[dict[str, Any]]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat_of(int(name))
            if st is not None:
                out.append(st)
    return out


def run_processes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Every live process of a run: descended from its monitor (which adopts the server's orphans)
    or from the server, in the server's session, or recorded at gate time; each by PID and start
    time. The monitor itself is not one of them."""
    stats = all_stats()
    by_pid = {s["pid"]: s for s in stats}
    started = run["start_ticks"]
    # The server's session: its members keep the server's PID as their session id after it exits
    # (the kernel does not reuse a PID while a session holds it). A live process WITH that PID that
    # is not the server leads someone else's session: then none of it is ours.
    leader = by_pid.get(run["pid"])
    ours = leader is None or leader["start_ticks"] == run["start_ticks"]
    found = {s["pid"]: s for s in stats
             if ours and s["state"] != "Z" and s["start_ticks"] >= started and s["sid"] == run["pid"]}
    roots = []
    server = by_pid.get(run["pid"])
    if server is not None and server["start_ticks"] == run["start_ticks"]:
        found[server["pid"]] = server
        roots.append(server["pid"])
    monitor = by_pid.get(int(run.get("monitor") or 0))
    if monitor is not None and monitor["start_ticks"] == run.get("monitor_ticks"):
        roots.append(monitor["pid"])
    children: dict[int, list[dict[str, Any]]] = {}
    for s in stats:
        children.setdefault(s["ppid"], []).append(s)
    while roots:
        for child in children.get(roots.pop(), []):
            if child["pid"] not in found and child["state"] != "Z" and child["pid"] != run.get("monitor"):
                found[child["pid"]] = child
                roots.append(child["pid"])
    for r in run.get("recorded", []):
        rec = by_pid.get(r["pid"])
        if rec is not None and rec["start_ticks"] == r["start_ticks"] and rec["state"] != "Z":
            found[rec["pid"]] = rec
    return list(found.values())


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def parse_env(text: str) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads it: ``KEY=value`` lines, ``#``/``;`` comments, a
    "double-quoted" value with backslash escapes (it may span lines), a 'single-quoted' one taken
    as it is, an unquoted one to the end of its line."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        end = text.find("\n", i)
        end = n if end < 0 else end + 1
        line = text[i:end]
        if not line.strip() or line.lstrip()[0] in "#;" or "=" not in line:
            i = end
            continue
        key = line.split("=", 1)[0].strip()
        j = i + line.index("=") + 1
        while j < n and text[j] in " \t":
            j += 1
        chars: list[str] = []
        if j < n and text[j] in "'\"":
            quote, j = text[j], j + 1
            while j < n and text[j] != quote:
                if quote == '"' and text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    chars.append("" if nxt == "\n" else nxt if nxt in '"\\`$' else "\\" + nxt)
                    j += 2
                    continue
                chars.append(text[j])
                j += 1
            value = "".join(chars)
            nl = text.find("\n", j)
            i = n if nl < 0 else nl + 1
        else:
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n:
                    chars.append("" if text[j + 1] == "\n" else text[j + 1])
                    j += 2
                    continue
                chars.append(text[j])
                j += 1
            value = "".join(chars).rstrip(" \t\r")
            i = j + 1
        out[key] = value
    return out


def env_file(path: str) -> dict[str, str]:
    try:
        with open(path) as f:
            return parse_env(f.read())
    except OSError:
        return {}


def recorded_pids(unit: str) -> list[dict[str, Any]]:
    """The PIDs (with start times) deploy recorded for the unit at gate time: workers that may have
    left the server's session and ancestry."""
    return list((read_json(f"{RECORDS_DIR}/{unit}.json") or {}).get("pids", []))


def start(unit: str) -> dict[str, Any]:
    spec = read_json(f"{UNITS_DIR}/{unit}.json")
    if spec is None:
        raise SystemExit(f"no unit file {UNITS_DIR}/{unit}.json")
    old = read_json(f"{RUNS_DIR}/{unit}.json")
    restarted = bool(old and alive(old["pid"], old["start_ticks"]))
    # Every process of earlier runs ends first, also when only the main PID died and its workers
    # live on (holding the port and GPU memory): the new run's record would lose track of them and
    # the gate could be answered by the old server's child.
    survivors = run_processes({**old, "recorded": recorded_pids(unit)}) if old else []
    if survivors:
        stop([unit])
        left = run_processes({**old, "recorded": recorded_pids(unit)})
        if left:
            pids = ", ".join(str(p["pid"]) for p in left)
            raise SystemExit(f"processes of the previous run of {unit} are still alive after its stop (pids {pids}); "
                             "not started")
    run_id = uuid.uuid4().hex
    log = f"{LOG_DIR}/{unit}/{run_id}.log"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    os.makedirs(spec["working_directory"], exist_ok=True)
    start_us = time.time_ns() // 1000
    r, w = os.pipe()
    monitor = os.fork()
    if monitor == 0:  # the monitor: its own session, so it outlives our ssh session
        os.close(r)
        os.setsid()
        _monitor(unit, spec, run_id, log, start_us, w)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        reply = f.read()
    os.waitpid(monitor, 0)
    if not reply:
        raise SystemExit(f"the monitor of {unit} did not start it")
    run = json.loads(reply)
    run["restarted"] = restarted
    if survivors and not restarted:
        pids = ", ".join(str(p["pid"]) for p in survivors)
        run["notes"] = [f"stopped what the previous run left behind when its main process died (pids {pids})",
                        *run.get("notes", [])]
    return dict(run)


def _monitor(unit: str, spec: dict[str, Any], run_id: str, log: str, start_us: int, report: int) -> None:
    if os.fork() != 0:
        os._exit(0)  # the monitor's parent (our start) returns at once; init adopts the monitor
    # Let go of our caller's stdin/stdout/stderr (the ssh channel): the start command ends now, the
    # monitor lives on. It reports through the ``report`` pipe only.
    devnull_fd = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull_fd, fd)
    _become_subreaper()
    # The memory policy is set here, in the monitor, so its failure can be told in the start's reply;
    # the server inherits it (fork keeps it, exec keeps it).
    numa = spec.get("numa")
    unbound = bind_memory(numa)
    notes = [f"NUMA memory binding ({numa['policy']} to node(s) {', '.join(map(str, numa['nodes']))}) "
             f"not applied: {unbound}; the server's memory is not bound"] if unbound and numa else []
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    env.update(env_file(spec["env_file"]))
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    for note in notes:
        os.write(out, f"gpudeploy: {note}\n".encode())
    server = os.fork()
    if server == 0:
        try:
            os.setsid()  # its own session and process group: stop signals the whole group
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir(spec["working_directory"])
            if spec.get("cpus"):
                os.sched_setaffinity(0, set(spec["cpus"]))
            import resource

            for name, value in (spec.get("limits") or {}).items():
                limit = resource.RLIM_INFINITY if value == "infinity" else int(value)
                with contextlib.suppress(ValueError, OSError, AttributeError):
                    resource.setrlimit(getattr(resource, name), (limit, limit))
            os.execvpe(spec["argv"][0], spec["argv"], env)  # noqa: S606 - argv from our own spec, no shell
        except BaseException as exc:  # exec failed: say why in the run's log, like systemd does
            os.write(2, f"gpudeploy: cannot start {spec['argv'][0]}: {exc}\n".encode())
            os._exit(127)
    st = stat_of(server) or {"start_ticks": 0}
    me = stat_of(os.getpid()) or {"start_ticks": 0}
    run = {"unit": unit, "run_id": run_id, "pid": server, "start_ticks": st["start_ticks"], "log": log,
           "start_us": start_us, "monitor": os.getpid(), "monitor_ticks": me["start_ticks"], "notes": notes}
    write_json(f"{RUNS_DIR}/{unit}.json", run)
    os.write(report, json.dumps(run).encode())
    os.close(report)
    # Reap the server and every orphan of it adopted here (see _become_subreaper) until none is
    # left; the server's own exit is what the run ended with.
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if pid != server:
            continue
        if os.WIFSIGNALED(status):
            words = {"code": "killed", "status": signal.Signals(os.WTERMSIG(status)).name[3:]}
        else:
            words = {"code": "exited", "status": str(os.WEXITSTATUS(status))}
        current = read_json(f"{RUNS_DIR}/{unit}.json") or {}
        write_json(f"{RUNS_DIR}/{unit}.exit-{run_id}.json", {**words, "at_us": time.time_ns() // 1000,
                                                             "stopped": bool(current.get("stopping"))})


def _become_subreaper() -> None:
    """Orphans of the server (a TP worker that double-forked into a session of its own) become the
    monitor's children instead of init's: still descendants, so a stop finds them by ancestry
    (Linux prctl PR_SET_CHILD_SUBREAPER; without it, the PIDs recorded at gate time remain)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


# set_mempolicy(2) modes and syscall numbers (glibc has no wrapper; libnuma may be absent).
MEMPOLICY = {"preferred": 1, "bind": 2, "interleave": 3}
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}


def bind_memory(numa: dict[str, Any] | None) -> str:
    """Apply the spec's NUMA memory policy to this process (its children inherit it across fork and
    exec, as systemd's NUMAPolicy= does for a unit); "" when done or not asked, else why not."""
    if not numa:
        return ""
    import ctypes
    import platform

    nodes, policy = [int(n) for n in numa["nodes"]], str(numa["policy"])
    number = SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None or policy not in MEMPOLICY:
        return f"set_mempolicy is not known here ({platform.machine()}, policy {policy})"
    words = max(nodes) // 64 + 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MEMPOLICY[policy], mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        errno = ctypes.get_errno()
        return f"set_mempolicy({policy}, nodes {nodes}) failed: {os.strerror(errno)}"
    return ""


def _kill_exact(procs: list[dict[str, Any]], sig: int) -> None:
    for p in procs:
        if alive(p["pid"], p["start_ticks"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p["pid"], sig)


def stop(units: list[str]) -> list[dict[str, Any]]:
    """Stop several units at once: SIGTERM to each server's process group, then, once a unit's
    own stop timeout (its spec's, like TimeoutStopSec=) has passed with processes left, SIGKILL to
    the group and to every process of the run, each by PID and start time."""
    runs: dict[str, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for unit in units:
        run = read_json(f"{RUNS_DIR}/{unit}.json")
        if run is None:
            out[unit] = {"unit": unit, "was": "inactive", "left": []}
            continue
        spec = read_json(f"{UNITS_DIR}/{unit}.json") or {}
        run["recorded"] = recorded_pids(unit)
        run["deadline"] = time.monotonic() + float(spec.get("stop_timeout_s", 30))
        run["was_alive"] = alive(run["pid"], run["start_ticks"])
        write_json(f"{RUNS_DIR}/{unit}.json", {**{k: v for k, v in run.items() if k not in ("deadline",
                                                                                                "was_alive")},
                                               "stopping": True})
        if run["was_alive"]:
            with contextlib.suppress(ProcessLookupError):  # the server leads its group (setsid): pgid == its PID
                os.killpg(run["pid"], signal.SIGTERM)
        # Every other process of the run gets its SIGTERM too (by PID and start time), first of all
        # the survivors of a main process that already died: a chance to free GPU memory cleanly
        # before the SIGKILL, as systemd's control-group stop gives every process of the unit.
        _kill_exact(run_processes(run), signal.SIGTERM)
        runs[unit] = run
    pending = dict(runs)
    while pending:
        for unit, run in list(pending.items()):
            if not run_processes(run):
                del pending[unit]
            elif time.monotonic() >= run["deadline"]:
                if alive(run["pid"], run["start_ticks"]):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run["pid"], signal.SIGKILL)
                _kill_exact(run_processes(run), signal.SIGKILL)
                run["deadline"] = time.monotonic() + 5  # for the kernel and the monitor to reap them
                run["killed"] = run.get("killed", 0) + 1
                if run["killed"] > 2:
                    del pending[unit]
        time.sleep(0.05)
    for unit, run in runs.items():
        out[unit] = {"unit": unit, "was": "active" if run["was_alive"] else "inactive",
                     "left": [p["pid"] for p in run_processes(run)], "killed": run.get("killed", 0)}
    return [out[u] for u in units]


def tail_offset(path: str, lines: int) -> int:
    """Where the last ``lines`` lines of the file at ``path`` begin (looking back at most TAIL_BYTES)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except OSError:
        return 0
    ends = [i for i, b in enumerate(data) if b == 0x0A]
    if data.endswith(b"\n"):
        ends.pop()
    if len(ends) >= lines:
        return start + ends[-lines] + 1
    return start if start == 0 else start + (ends[0] + 1 if ends else len(data))


def watch(wanted: list[dict[str, Any]], tail: int | None = None) -> None:
    """Follow runs ({"unit", "run_id"}; the run files give their PID, start time and log) -> JSON
    lines on stdout: {"unit", "line"} for each log line, then {"unit", "exit"}; {"alive": true}
    after KEEPALIVE_S of silence."""
    runs = []
    for w in wanted:
        run = read_json(f"{RUNS_DIR}/{w['unit']}.json") or {}
        if run.get("run_id") != w["run_id"]:  # replaced already: treat this run as over
            run = {"pid": 0, "start_ticks": 0, "log": f"{LOG_DIR}/{w['unit']}/{w['run_id']}.log"}
        runs.append({**run, **w})
    offsets = {r["unit"]: tail_offset(r["log"], tail) if tail is not None else 0 for r in runs}
    partial = {r["unit"]: b"" for r in runs}
    done: set[str] = set()
    said = time.monotonic()
    while len(done) < len(runs):
        if time.monotonic() - said >= KEEPALIVE_S:
            _emit({"alive": True})
            said = time.monotonic()
        for r in runs:
            if r["unit"] in done:
                continue
            try:
                with open(r["log"], "rb") as f:
                    f.seek(offsets[r["unit"]])
                    data = f.read(1 << 20)
            except OSError:
                data = b""
            offsets[r["unit"]] += len(data)
            lines = (partial[r["unit"]] + data).split(b"\n")
            rest = lines.pop()
            while len(rest) > MAX_LINE:
                lines.append(rest[:MAX_LINE])
                rest = rest[MAX_LINE:]
            partial[r["unit"]] = rest
            for line in lines:
                for at in range(0, max(1, len(line)), MAX_LINE):
                    _emit({"unit": r["unit"], "line": line[at:at + MAX_LINE].decode(errors="replace")})
                    said = time.monotonic()
            exit_info = read_json(f"{RUNS_DIR}/{r['unit']}.exit-{r['run_id']}.json")
            ended = exit_info is not None or not alive(r["pid"], r["start_ticks"])
            if ended and not data:  # everything the log had before the end has been sent
                if partial[r["unit"]]:
                    _emit({"unit": r["unit"], "line": partial[r["unit"]].decode(errors="replace")})
                info = exit_info or {"code": "exited", "status": "unknown"}
                _emit({"unit": r["unit"], "exit": f"Main process exited, code={info['code']}, "
                                                  f"status={info['status']}" + (", stopped" if info.get("stopped")
                                                                                else "")})
                done.add(r["unit"])
        time.sleep(0.1)


def logs(unit: str, run_id: str, lines: int, follow: bool) -> None:
    path = f"{LOG_DIR}/{unit}/{run_id}.log"
    try:
        with open(path, "rb") as f:
            tail = f.read().split(b"\n")
            sys.stdout.buffer.write(b"\n".join(tail[-lines - 1:]))
            sys.stdout.flush()
            while follow:
                data = f.read(1 << 16)
                if data:
                    sys.stdout.buffer.write(data)
                    sys.stdout.flush()
                else:
                    time.sleep(0.2)
    except OSError as exc:
        raise SystemExit(f"no log of run {run_id}: {exc}") from None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return ""


def unit_facts(names: list[str], deployments: list[str], log_lines: int) -> dict[str, Any]:
    """What the host probe reports of process-supervised units: the named ones and every unit
    whose spec names one of ``deployments``."""
    wanted = list(names)
    try:
        files = sorted(os.listdir(UNITS_DIR))
    except OSError:
        files = []
    for file in files:
        spec = read_json(f"{UNITS_DIR}/{file}") if file.endswith(".json") else None
        if spec and spec.get("deployment") in deployments and spec.get("unit") not in wanted:
            wanted.append(spec["unit"])
    out: dict[str, Any] = {}
    for unit in wanted:
        spec = read_json(f"{UNITS_DIR}/{unit}.json")
        run = read_json(f"{RUNS_DIR}/{unit}.json")
        record = read_json(f"{RECORDS_DIR}/{unit}.json")
        exit_info = read_json(f"{RUNS_DIR}/{unit}.exit-{run['run_id']}.json") if run else None
        is_alive = bool(run) and alive(run["pid"], run["start_ticks"])
        procs = []
        if run:
            recorded = (record or {}).get("pids", []) if (record or {}).get("invocation") == run["run_id"] else []
            procs = [{**p, "cmd": cmdline(p["pid"])} for p in run_processes({**run, "recorded": recorded})]
        recorded_alive = [{**p, "cmd": cmdline(p["pid"])} for p in (record or {}).get("pids", [])
                          if alive(p["pid"], p["start_ticks"])]
        tail: list[str] = []
        if run and not is_alive:
            try:
                with open(run["log"], "rb") as f:
                    tail = f.read().decode(errors="replace").splitlines()[-log_lines:]
            except OSError:
                pass
        meta = None
        if spec:
            keys = ("deployment", "role", "kind", "env_file", "state_directory")
            meta = {k: str(spec[k]) for k in keys if spec.get(k)}
        out[unit] = {"spec": spec, "meta": meta, "run": run, "exit": exit_info, "alive": is_alive, "procs": procs,
                     "record": record, "recorded_alive": recorded_alive, "log_tail": tail}
    return out


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    command, arg = sys.argv[1], json.loads(sys.argv[2])
    if command == "start":
        _emit(start(arg["unit"]))
    elif command == "stop":
        for result in stop(arg["units"]):
            _emit(result)
    elif command == "watch":
        try:
            watch(arg["runs"], arg.get("tail"))
        except BrokenPipeError:  # the reader went away: nothing is left to do
            with contextlib.suppress(OSError):
                os.close(1)
    elif command == "logs":
        logs(arg["unit"], arg["run_id"], int(arg["lines"]), bool(arg["follow"]))
