"""Run the real SGLang 0.5.23 server (the lab's CPU build) on this machine, no lab needed.

Used by the ``sglang`` tier (test_real_vs_standin.py) and by record_real_sglang.py, which wrote the
recorded logs under tests/verify/data/sglang-0.5.23-cpu/. The engine is what ``python -m gpudeploy_lab
engine`` builds (recipe SGLANG in src/gpudeploy_lab/engine.py): sglang 0.5.23 on the CPU build of
torch, and the tiny random-weight Llama of the vLLM build as the model.

Processes are only ever signalled by PID: the server's main process (started here) and its
descendants, found from it through /proc (``sglang::scheduler``, ``sglang::detokenizer`` and a
multiprocessing resource tracker).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpudeploy_lab import engine

PYTHON = engine.SGLANG.python
MODEL = engine.VLLM.link / "model"  # the vLLM build's tiny random-weight Llama


def missing() -> str | None:
    """Why the real engine cannot run here, or None when it can."""
    # the engine the lab uses now (its symlink), whichever recipe key built it
    if not (engine.SGLANG.link / ".complete").exists() or not PYTHON.exists():
        return (f"the real SGLang engine is not built ({engine.SGLANG.link} has no .complete): "
                "run `python -m gpudeploy_lab engine`")
    if not (MODEL / "config.json").exists():
        return f"the tiny model is missing ({MODEL}/config.json): run `python -m gpudeploy_lab engine`"
    return None


def proc_children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc/*/stat)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(d.name))
    return sorted(out)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = proc_children(todo.pop())
        out += kids
        todo += kids
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


class Server:
    """One server process with its combined stdout/stderr kept byte for byte (and split in lines).

    ``argv`` is run as given; ``log`` (optional) receives the raw output as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path | None = None,
                 cwd: Path | None = None) -> None:
        self.argv = argv
        self.t0 = time.monotonic()
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
        self.pid = self.popen.pid
        self.raw = bytearray()
        self.lines: list[str] = []
        self.seen: set[int] = set()  # every descendant PID seen, so that none is left behind
        self.cond = threading.Condition()
        self._log = log.open("wb") if log is not None else None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        partial = b""
        while True:
            chunk = os.read(self.popen.stdout.fileno(), 65536)
            with self.cond:
                if not chunk:
                    if partial:
                        self.lines.append(partial.decode(errors="replace"))
                    self.cond.notify_all()
                    break
                self.raw += chunk
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                *done, partial = (partial + chunk).split(b"\n")
                self.lines += [d.decode(errors="replace") for d in done]
                self.cond.notify_all()
        if self._log is not None:
            self._log.close()

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def wait_line(self, pattern: str, timeout: float) -> str:
        """The first output line matching ``pattern`` (a regex), waiting for it."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hit = next((ln for ln in self.lines if rx.search(ln)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self.reader.is_alive()):
                    tail = "\n".join(self.lines[-30:])
                    raise TimeoutError(f"no line matching {pattern!r} within {timeout:g} s; last lines:\n{tail}")
                self.cond.wait(min(left, 0.2))

    def children(self) -> list[int]:
        kids = descendants(self.pid)
        self.seen.update(kids)
        return kids

    def child_named(self, name: str, timeout: float = 60.0) -> int:
        """The descendant whose /proc comm is ``name`` (e.g. "sglang::schedul": comm keeps 15 chars)."""
        def find() -> int | None:
            return next((p for p in self.children() if comm(p) == name), None)
        return int(str(wait_until(find, timeout, f"a child {name!r} of {self.pid}")))

    def rss_kib(self) -> int:
        """The resident memory of the server and all its processes."""
        return sum(rss_kib(p) for p in [self.pid, *self.children()])

    def signal_all(self, sig: int) -> list[int]:
        """Send ``sig`` to the main process and every descendant, each by PID; the PIDs signalled."""
        pids = [self.pid, *self.children()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def wait_exit(self, timeout: float) -> int | None:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.reader.join(timeout=5)
        return code

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM the main process (SGLang's own shutdown), then SIGKILL whatever of it is left."""
        code = self.popen.poll()
        if code is None:
            self.children()
            os.kill(self.pid, signal.SIGTERM)
            code = self.wait_exit(grace)
        self.kill()
        return code

    def kill(self) -> None:
        """SIGKILL the main process and every descendant ever seen, by PID."""
        if self.popen.poll() is None:
            self.children()
            self.signal_all(signal.SIGKILL)
            self.popen.wait(timeout=10)
        for pid in sorted(self.seen):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in sorted(self.seen):
            wait_until(lambda p=pid: not alive(p), 10.0, f"PID {pid} to end")  # type: ignore[misc]
        self.reader.join(timeout=5)


def server_argv(*args: str, python: Path = PYTHON) -> list[str]:
    return [str(python), "-m", "sglang.launch_server", *args]


def real_env(home: Path, extra: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """What the real server runs with: a fresh HOME (no caches of this machine), no model hub."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
    env.update(dict(extra))
    return env


def block_mooncake(folder: Path) -> None:
    """Make ``folder`` a PYTHONPATH entry whose sitecustomize makes ``import mooncake`` fail as it
    does where the package is not installed (ModuleNotFoundError), in every process of the server."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _NoMooncake(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mooncake' or name.startswith('mooncake.'):\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoMooncake())\n")
