"""One stand-in TP rank ("scheduler" process): runs a script the engine wrote for it.

Started by :mod:`gpudeploy_lab.standin.engine` as ``python3 -m gpudeploy_lab.standin.worker --rank N
--status-fd FD``. The first line on stdin is the JSON script; later stdin lines are commands
(``crash``; ``world``: all nodes of a multi-node group joined; ``peer-lost ADDR``: one left).
EOF on stdin means the engine died: the worker removes its GPU record and exits,
unless it has detached (``leak``), in which case it lives on as an orphan holding its record.

Messages to the engine go to the status pipe, one word per line: ``weights``, ``ready``,
``error`` (a failure was logged), ``silent`` (the engine should exit without a message).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from gpudeploy_lab.standin.common import emit, remove_record, write_record
from gpudeploy_lab.standin.progress import Tqdm


class Worker:
    def __init__(self, script: dict[str, Any], status_fd: int) -> None:
        self.script = script
        self.tag = str(script["tag"])
        self.gpu = int(script["gpu"])
        self.status_fd = status_fd
        self.mark = time.monotonic()
        self.used = 0
        self.detached = False
        self.lock = threading.Lock()
        self.bar: Tqdm | None = None  # rank 0's tqdm bar on stderr, one at a time
        self.world = threading.Event()  # every node of a multi-node group has joined

    # -------------------------------------------------------------------------------- helpers

    def send(self, msg: str) -> None:
        if self.status_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.status_fd, (msg + "\n").encode())

    def set_mem(self, used: int) -> None:
        if self.gpu < 0:
            return  # no GPU (--device cpu, or an invalid device ordinal): nothing for the fake NVML
        self.used = used
        write_record(os.getpid(), self.gpu, used)

    def finish(self, code: int) -> None:
        remove_record(os.getpid())
        os._exit(code)

    def fail(self, text: str, code: int) -> None:
        with self.lock:
            self.send("error")
            emit(text, self.tag)
            self.finish(code)

    # --------------------------------------------------------------------------------- actions

    def run(self) -> None:
        for act in self.script["actions"]:
            op = act["op"]
            if op == "log":
                text = str(act["text"])
                if act.get("elapsed"):
                    text = text.replace("{elapsed}", f"{time.monotonic() - self.mark:.2f}")
                if act.get("raw"):
                    os.write(1, (text + "\n").encode())
                else:
                    emit(text, act.get("tag", self.tag))
            elif op == "mark":
                self.mark = time.monotonic()
            elif op == "sleep":
                time.sleep(float(act["s"]))
            elif op == "mem":
                self.set_mem(int(act["bytes"]))
            elif op == "send":
                self.send(str(act["msg"]))
            elif op == "fail":
                self.fail(str(act["text"]), int(act.get("code", 1)))
            elif op == "exit":
                self.finish(int(act.get("code", 1)))
            elif op == "die":
                os.kill(os.getpid(), int(act.get("signal", signal.SIGKILL)))
                time.sleep(5)
            elif op == "leak":
                self.detach()
            elif op == "bar":
                self.bar_op(act)
            elif op == "hang":
                threading.Event().wait()
            elif op == "world":
                self.world.wait()
        threading.Event().wait()  # ready: serve until told otherwise

    def bar_op(self, act: dict[str, Any]) -> None:
        do = act["do"]
        if do == "open":
            self.bar = Tqdm(int(act["total"]), desc=act.get("desc"), bar_format=act.get("format"))
        elif self.bar is None:
            return
        elif do == "desc":
            self.bar.set_description(str(act["text"]))
        elif do == "step":
            self.bar.iterated()
        elif do == "update":
            self.bar.update()
        elif do == "close":
            self.bar.close()
            self.bar = None

    def detach(self) -> None:
        """Double-fork into a new session. The original process stays as the engine's child (a
        placeholder that goes away with the engine); the grandchild carries on as this rank and
        ignores its parent's death, like an orphaned scheduler."""
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            self.detached = True
            if self.used:
                write_record(os.getpid(), self.gpu, self.used)
            return
        os.waitpid(pid, 0)
        # Placeholder: no record, no status; exits with the engine (stdin EOF, seen by
        # watch_stdin) or on SIGTERM.
        self.status_fd = -1
        self.used = 0
        remove_record(os.getpid())
        threading.Event().wait()

    def watch_stdin(self) -> None:
        """Commands from the engine; EOF = the engine is gone."""
        while True:
            line = sys.stdin.buffer.readline()
            if self.detached:
                return
            if not line:
                with self.lock:
                    self.finish(0)
            cmd = line.decode(errors="replace").strip()
            if cmd == "crash":
                self.fail(str(self.script.get("crash_text") or "RuntimeError: crash"), 1)
            elif cmd == "world":
                self.world.set()
            elif cmd.startswith("peer-lost "):
                # another node of the group is gone: this rank's next gloo broadcast fails
                text = str(self.script.get("peer_lost_text") or "RuntimeError: Connection closed by peer {peer}")
                self.fail(text.replace("{peer}", cmd.split(" ", 1)[1]), 1)


def set_process_name(title: str) -> None:
    """The name ``ps``/``/proc/PID/comm`` show, as 0.5.23's setproctitle does ("sglang::scheduler", with
    "_TP1" when tp > 1; comm keeps 15 bytes: "sglang::schedul"). Best effort (prctl PR_SET_NAME)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, title.encode()[:15] + b"\0", 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpudeploy_lab.standin.worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--status-fd", type=int, required=True)
    args = ap.parse_args(argv)
    first = sys.stdin.buffer.readline()
    if not first:
        return 1
    script: dict[str, Any] = json.loads(first)
    set_process_name(str(script.get("title") or "sglang::scheduler"))
    worker = Worker(script, args.status_fd)

    def on_term(signum: int, frame: object) -> None:
        worker.finish(0)

    if script.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides; Ctrl-C reaches the group
    threading.Thread(target=worker.watch_stdin, daemon=True).start()
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
