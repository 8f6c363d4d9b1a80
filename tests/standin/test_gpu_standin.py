"""The GPU stand-in engine (gpudeploy_lab.gpu_standin) without a GPU: --dry-run, and its torch path
against a test double of torch (tests/standin/fake_torch). On the H200 it runs with the real torch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_support import PYTHON, REPO, alive, children_of, free_port, http_get, wait_for

STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP{r}\] "
NUM = r"\d+\.\d\d"
RANK_LINES = [
    r"GPU UUID of rank {r}: GPU-[0-9a-f-]{{36}}$",
    r"Init torch distributed begin\.$",
    r"NCCL all-reduce of \d+ ranks: (.*)$",
    r"Init torch distributed ends\. mem usage=0\.00 GB$",
    rf"Load weight begin\. avail mem=({NUM}) GB$",
    rf"Load weight end\. elapsed={NUM} s, type=GpuStandinForCausalLM, avail mem=({NUM}) GB, mem usage=({NUM}) GB\.$",
    rf"KV Cache is allocated\. #tokens: (\d+), K size: ({NUM}) GB, V size: ({NUM}) GB$",
    rf"Memory pool end\. avail mem=({NUM}) GB$",
]
READY = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$")


class Standin:
    """The launcher in its own session and process group, as a supervisor starts it."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = tmp / f"standin-{self.port}.log"
        base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src")}
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                [PYTHON, "-m", "gpudeploy_lab.gpu_standin", "--port", str(self.port), *args],
                env={**base, **(env or {})}, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=REPO, start_new_session=True)
        self.workers: set[int] = set()

    @property
    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def wait_line(self, needle: str, timeout: float = 15) -> str:
        def found() -> str | None:
            self.workers.update(children_of(self.popen.pid))
            return next((ln for ln in self.lines if needle in ln), None)
        try:
            return str(wait_for(found, timeout))
        except AssertionError:
            raise AssertionError(f"{needle!r} not logged:\n" + "\n".join(self.lines)) from None

    def health(self) -> int | None:
        got = http_get(self.port, "/health")
        return None if got is None else got[0]

    def close(self) -> None:
        if self.popen.poll() is None:
            self.workers.update(children_of(self.popen.pid))
            self.popen.kill()
            self.popen.wait(5)
        for pid in self.workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Standin]]:
    made: list[Standin] = []
    yield made
    for s in made:
        s.close()


def start(started: list[Standin], tmp: Path, *args: str, env: dict[str, str] | None = None) -> Standin:
    s = Standin(tmp, *args, env=env)
    started.append(s)
    return s


def rank_values(lines: list[str], rank: int) -> list[tuple[str, ...]]:
    """Each rank's lines in order, as the regexes' groups."""
    prefix = STAMP.replace("{r}", str(rank))
    mine = [ln for ln in lines if re.match(prefix, ln)]
    assert len(mine) >= len(RANK_LINES), "\n".join(lines)
    out = []
    for ln, pattern in zip(mine, RANK_LINES, strict=False):
        m = re.match(prefix + pattern.format(r=rank), ln)
        assert m, f"{ln!r} !~ {pattern}"
        out.append(m.groups())
    return out


def test_dry_run_tp2_lines_health_and_sigterm_to_the_group_ends_all(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--tp", "2", "--gib", "10", "--dry-run", "--phase-s", "0.4")
    wait_for(lambda: s.health() is not None, 10)
    assert s.health() == 503  # serving from the start, not ready
    s.wait_line("The server is fired up and ready to roll!")
    assert s.health() == 200
    workers = sorted(children_of(s.popen.pid))
    assert len(workers) == 2
    for w in workers:  # same session and process group as the launcher: one signal reaches all
        stat = Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[2]) == s.popen.pid and int(stat[3]) == s.popen.pid
    lines = s.lines
    for rank in (0, 1):
        v = rank_values(lines, rank)
        assert v[2] == ("skipped (--dry-run)",)  # no torch: no NCCL group
        before, after_w, usage = float(v[4][0]), float(v[5][0]), float(v[5][1])
        assert before == 139.29  # 139.80 GiB less the 518 MiB context, as torch shows an idle H200
        assert usage == 4.00 and round(before - after_w, 2) == usage  # 40% of 10 GiB as weights
        tokens, k, vv = int(v[6][0]), float(v[6][1]), float(v[6][2])
        assert (k, vv) == (3.00, 3.00) and tokens == 6 * (1 << 30) // 131072
        assert float(v[7][0]) == round(after_w - 6, 2)
    ready = [i for i, ln in enumerate(lines) if READY.match(ln)]
    assert len(ready) == 1 and ready[0] == len(lines) - 1, "\n".join(lines)
    info = json.loads(http_get(s.port, "/server_info")[1])  # type: ignore[index]
    assert [r["pid"] for r in info["ranks"]] == workers
    assert [r["uuid"] for r in info["ranks"]] == ["GPU-00000000-0000-0000-0000-000000000000",
                                                  "GPU-00000000-0000-0000-0000-000000000001"]
    os.killpg(s.popen.pid, signal.SIGTERM)
    assert s.popen.wait(10) == 0, "\n".join(s.lines)
    wait_for(lambda: not any(alive(w) for w in workers), 5)


def test_workers_die_with_a_sigkilled_launcher(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--tp", "3", "--gib", "1", "--dry-run", "--phase-s", "0")
    s.wait_line("The server is fired up and ready to roll!")
    workers = children_of(s.popen.pid)
    assert len(workers) == 3
    t0 = time.monotonic()
    s.popen.kill()  # only the launcher: its end of each life pipe closes
    s.popen.wait(5)
    wait_for(lambda: not any(alive(w) for w in workers), 5)
    assert time.monotonic() - t0 < 3


def test_sigterm_to_the_launcher_alone_ends_its_workers(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--tp", "2", "--gib", "1", "--dry-run", "--phase-s", "0")
    s.wait_line("The server is fired up and ready to roll!")
    workers = children_of(s.popen.pid)
    s.popen.send_signal(signal.SIGTERM)
    assert s.popen.wait(10) == 0
    assert not any(alive(w) for w in workers)
    assert "INFO:     Shutting down" in s.lines


def test_fault_oom_is_torch_s_error_and_the_launcher_exits_1(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--tp", "2", "--gib", "10", "--fault", "oom", "--dry-run")
    assert s.popen.wait(15) == 1, "\n".join(s.lines)
    text = "\n".join(s.lines)
    assert re.search(r"^\[[\d :-]+ TP0\] Scheduler hit an exception: Traceback \(most recent call last\):$", text,
                     re.M), text
    oom = next(ln for ln in s.lines if ln.startswith("torch.OutOfMemoryError"))
    # rank 0 asked for the GPU's total plus its weights: 139.80 + 4.00 GiB
    assert oom.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 143.80 GiB. GPU 0 has a "
                          "total capacity of 139.80 GiB of which 139.29 GiB is free. Including non-PyTorch memory, "
                          "this process has 518.00 MiB memory in use."), oom
    # the rest as torch 2.11 printed it on the H200 (bench/results/h200-process-supervisor-2026-12-01.txt)
    assert oom.endswith("Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by "
                        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
                        "for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
                        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"), oom
    assert s.lines[-1].endswith("] Received sigquit from a child process. It usually means the child failed.")
    assert not [ln for ln in s.lines if READY.match(ln)]
    assert not children_of(s.popen.pid)


def test_a_worker_that_dies_takes_the_launcher_down(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--tp", "2", "--gib", "1", "--dry-run", "--phase-s", "0")
    s.wait_line("The server is fired up and ready to roll!")
    victim = sorted(children_of(s.popen.pid))[1]
    os.kill(victim, signal.SIGKILL)
    assert s.popen.wait(10) == 1
    assert any("Rank 1 scheduler is dead." in ln for ln in s.lines), "\n".join(s.lines)
    assert any(f"exitcode=-9. pid={victim}" in ln for ln in s.lines)


FAKE_TORCH = str(REPO / "tests/standin/fake_torch")


def test_torch_path_against_a_torch_double(started: list[Standin], tmp_path: Path) -> None:
    """Without --dry-run the workers call torch; here a double with torch's names and shapes stands in."""
    # TMPDIR: the double's process group rendezvous in folders there, gone with the test's own folder
    env = {"PYTHONPATH": f"{REPO / 'src'}:{FAKE_TORCH}", "FAKE_TORCH_GPUS": "2", "CUDA_VISIBLE_DEVICES": "0,1",
           "TMPDIR": str(tmp_path)}
    s = start(started, tmp_path, "--tp", "2", "--gib", "2", "--phase-s", "0", env=env)
    s.wait_line("The server is fired up and ready to roll!")
    lines = s.lines
    assert "] GPU UUID of rank 1: GPU-6e92d042-f5db-2c0f-70df-fc4595ae0001" in "\n".join(lines)
    for rank in (0, 1):  # both ranks joined one NCCL group; each checked the sum (1 + 2 on every element)
        assert re.fullmatch(r"4\.00 MiB in \d+\.\d\d ms, sum ok", rank_values(lines, rank)[2][0]), lines
    v = rank_values(lines, 0)
    assert float(v[5][1]) == 0.80  # mem usage measured from mem_get_info before and after
    info = json.loads(http_get(s.port, "/server_info")[1])  # type: ignore[index]
    assert all(isinstance(r["nccl_all_reduce_ms"], float) for r in info["ranks"]), info
    s.popen.send_signal(signal.SIGTERM)
    assert s.popen.wait(10) == 0
    assert list(tmp_path.glob("fake-torch-dist-*")), "the rendezvous was not in the test's own folder"
    # a rank without a device fails as torch fails (invalid device ordinal), the launcher exits 1
    s2 = start(started, tmp_path, "--tp", "3", "--gib", "1", "--phase-s", "0", env=env)
    assert s2.popen.wait(15) == 1
    text = "\n".join(s2.lines)
    assert "TP2] Scheduler hit an exception: Traceback" in text and "invalid device ordinal" in text, text
    s3 = start(started, tmp_path, "--gib", "1", "--fault", "oom", "--phase-s", "0", env=env)
    assert s3.popen.wait(15) == 1
    assert any(ln.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 140.20 GiB.")
               for ln in s3.lines), "\n".join(s3.lines)


def test_without_torch_and_without_dry_run_it_says_so(started: list[Standin], tmp_path: Path) -> None:
    s = start(started, tmp_path, "--gib", "1", "--phase-s", "0")
    assert s.popen.wait(15) == 1
    assert any(ln.startswith("ModuleNotFoundError: No module named 'torch'") for ln in s.lines), "\n".join(s.lines)


def test_bad_arguments_exit_2() -> None:
    for args in ([], ["--port", "1", "--gib", "1", "--tp", "0"], ["--port", "1", "--gib", "1", "--fault", "x"]):
        r = subprocess.run([PYTHON, "-m", "gpudeploy_lab.gpu_standin", *args], env={"PYTHONPATH": str(REPO / "src")},
                           capture_output=True, text=True, timeout=20, cwd=REPO)
        assert r.returncode == 2, (args, r.stderr)
