"""Power and utilisation in experiments (issue 25): the engine hosts' GPUs sampled through NVML for
the length of each benchmark run, by a sampler that leaves nothing behind; the figures of the client's
measured span; output tok/s per watt and mean power in the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakelab import FakeLab
from test_experiment_file import write

from gpudeploy.experiment import power
from gpudeploy.experiment.runner import run_experiment
from gpudeploy.experiment.show import summary, table
from gpudeploy.experiment.spec import load_experiment

FAKE_NVML = '''
import os
STANDIN = "a test's NVML"
class M: pass
def nvmlInit():
    if os.environ.get("NO_NVML"):
        raise RuntimeError("NVML Shared Library Not Found")
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetPowerUsage(h): return 100_000 + 1000 * h
def nvmlDeviceGetUtilizationRates(h):
    u = M(); u.gpu, u.memory = 40 + h, 20
    return u
def nvmlDeviceGetMemoryInfo(h):
    m = M(); m.used = (10 + h) << 30
    return m
'''


def sampler(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    (tmp_path / "pynvml.py").write_text(FAKE_NVML)
    return subprocess.Popen([sys.executable, "-c", power.SAMPLER, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(tmp_path), **(env or {})})


def lines(proc: subprocess.Popen[bytes], n: int) -> list[dict[str, object]]:
    assert proc.stdout is not None
    return [json.loads(proc.stdout.readline()) for _ in range(n)]


def ended_within(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


def test_the_sampler_reports_each_gpu_and_ends_when_its_channel_closes(tmp_path: Path) -> None:
    proc = sampler(tmp_path, "0,3", "0.05", "30")
    try:
        ready, first, second = lines(proc, 3)
        assert ready == {"ready": True, "standin": "a test's NVML"}
        assert first["gpus"] == {"0": [100.0, 40, 10 << 30], "3": [103.0, 43, 13 << 30]}
        assert isinstance(second["t"], float) and second["t"] >= first["t"]  # type: ignore[operator]
        assert proc.stdin is not None
        proc.stdin.close()  # what sshd does when gpudeploy closes the channel (or the connection drops)
        assert ended_within(proc, 5), "the sampler outlived its channel"
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_sampler_ends_when_the_heartbeat_stops(tmp_path: Path) -> None:
    # the channel stays open but gpudeploy is gone (sshd has not noticed): no heartbeat for BEAT_S ends it
    proc = sampler(tmp_path, "1", "0.05", "0.5")
    try:
        assert proc.stdin is not None
        proc.stdin.write(b".")
        proc.stdin.flush()
        assert ended_within(proc, 5), "the sampler outlived its heartbeat"
    finally:
        proc.kill()
        proc.wait()


def test_a_host_without_nvml_says_so_once_and_samples_nothing(tmp_path: Path) -> None:
    proc = sampler(tmp_path, "0", "0.05", "30", env={"NO_NVML": "1"})
    try:
        (said,) = lines(proc, 1)
        assert said == {"error": "NVML: NVML Shared Library Not Found"}
        assert ended_within(proc, 5)
    finally:
        proc.kill()
        proc.wait()


def test_the_figures_are_of_the_measured_span() -> None:
    gib = 2**30
    host = power.HostSamples("n1", [0, 1], standin="modelled")
    host.samples = [(t, {"0": [w, sm, 10 * gib], "1": [w + 100, sm, 30 * gib]})
                    for t, w, sm in ((1.0, 80.0, 0), (10.0, 400.0, 60), (11.0, 420.0, 80), (12.0, 410.0, 70),
                                     (30.0, 90.0, 0))]
    got = power.figures({"n1": host}, 9.5, 12.5)  # only the three samples while the client measured
    assert got["mean_power_w"] == pytest.approx(410.0 + 510.0)
    assert got["mean_sm_util_pct"] == pytest.approx(70.0) and got["peak_gpu_mem_gib"] == 30.0
    assert got["power_samples"] == 3 and got["power_standin"] is True and got["power_error"] is None
    everything = power.figures({"n1": host}, 100.0, 101.0)  # fewer than two inside: every sample
    assert everything["power_samples"] == 5
    lost = power.HostSamples("n2", [0], error="NVML: Driver Not Loaded")
    half = power.figures({"n1": host, "n2": lost}, 9.5, 12.5)
    assert half["mean_power_w"] is None and half["power_error"] == "n2: NVML: Driver Not Loaded"
    assert power.per_watt(1000.0, 400.0) == 2.5 and power.per_watt(1000.0, None) is None


VARIANTS = """\
variants:
  a: {}
benchmark: {concurrency: [1, 2], prompts: 8}
"""


def test_each_run_gets_mean_power_and_tok_s_per_watt_and_no_sampler_is_left(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    lab = FakeLab(monkeypatch)
    lab.watts = 250.0
    path = write(tmp_path, VARIANTS)
    store = run_experiment(load_experiment(path), say=lab.say)
    runs = [r for r in store.runs() if r.ok]
    assert [r.concurrency for r in runs] == [1, 2]
    for r in runs:
        f = r.figures
        assert f["mean_power_w"] == pytest.approx(8 * 250.0)  # the TP4 prefill's and the TP4 decode's GPUs
        assert f["output_tok_s_per_w"] == pytest.approx(round(f["output_tok_s"] / 2000.0, 3))
        assert f["mean_sm_util_pct"] == 50 and f["peak_gpu_mem_gib"] == 40.0 and f["power_samples"] > 0
    # one sampler per run on the one engine host (node171), each closed when its run ended
    assert len(lab.samplers) == 2 and all(s.closed for s in lab.samplers)
    assert all(s.argv[:4] == ["timeout", "-k", "5", f"{600 + 10 + power.MARGIN_S:g}"] for s in lab.samplers)
    assert sorted(lab.samplers[0].gpus) == [str(g) for g in range(8)]
    text = table(summary(store))
    head = next(line for line in text.splitlines() if "VARIANT" in line)
    assert " W " in head and " /W " in head, head
    row = next(line for line in text.splitlines() if line.lstrip("* ").split()[:2] == ["a", "1"])
    assert "2000" in row.split() and f"{runs[0].figures['output_tok_s_per_w']:.2f}" in row.split(), row
    assert "tok/s per W" in lab.out
