"""The stand-in's tqdm output against public SGLang logs and, where the lab's vLLM venv is built, real tqdm."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpudeploy_lab.standin import progress

# Scenarios: (bar_format or None, descs per pass or None, seconds per pass, env)
SCENARIOS = {
    "capture": (None, [16, 8, 4, 2, 1], [0.03, 0.2, 0.05, 0.5, 0.01], {}),
    "capture-fast": (None, list(range(40, 0, -1)), [0.004] * 40, {}),
    "capture-slow": (None, [8, 4, 2], [12.5, 0.3, 61.0], {}),
    "shards": (progress.SHARDS_BAR_FORMAT_059, None, [0.3, 0.02, 1.5, 0.4], {}),
    "shards-one": (progress.SHARDS_BAR_FORMAT_059, None, [0.01], {}),
    "capture-env-lines": (None, [4, 2, 1], [0.2, 0.2, 0.2],
                          {"TQDM_BAR_FORMAT": "{l_bar}{bar}{r_bar}\n", "TQDM_MININTERVAL": "0"}),
    "capture-env-ncols": (None, [4, 2, 1], [0.2, 0.2, 0.2], {"TQDM_NCOLS": "100"}),
}

REAL = r'''
import json, sys
scenario = json.loads(sys.argv[1])
clock = [1000.0]
import tqdm.std
tqdm.std.time = lambda: clock[0]
class Out:
    encoding = "utf-8"
    def __init__(self): self.parts = []
    def write(self, s): self.parts.append(s)
    def flush(self): pass
out = Out()
fmt, descs, steps = scenario["fmt"], scenario["descs"], scenario["steps"]
kw = {"bar_format": fmt} if fmt else {}
if scenario.get("update"):  # 0.5.23's shard loader: with tqdm(total=...) as pbar: ... pbar.update(1)
    with tqdm.std.tqdm(total=len(steps), file=out, desc=scenario["desc"], **kw) as pbar:
        for step in steps:
            clock[0] += step
            pbar.update(1)
else:
    bar = tqdm.std.tqdm(list(range(len(steps))), file=out, desc=scenario["desc"], **kw)
    for i in bar:
        if descs:
            bar.set_description(f"Capturing batches (bs={descs[i]} avail_mem={70 - i / 7:.2f} GB)")
        clock[0] += steps[i]
print(json.dumps("".join(out.parts)))
'''
# 0.5.23's multi-threaded shard loader (update style): seconds per shard
UPDATE_SCENARIOS = {"multi-thread-shards": [0.3, 0.02, 1.5, 0.4], "multi-thread-one": [0.01]}


def emulate_updates(steps: list[float]) -> str:
    clock = [1000.0]
    out: list[str] = []
    bar = progress.Tqdm(len(steps), desc=progress.SHARDS_DESC, bar_format=progress.SHARDS_BAR_FORMAT,
                        write=out.append, clock=lambda: clock[0], tty_fd=None)
    for step in steps:
        clock[0] += step
        bar.update()
    bar.close()
    return "".join(out)


def emulate(fmt: str | None, descs: list[int] | None, steps: list[float], env: dict[str, str],
            monkeypatch: pytest.MonkeyPatch) -> str:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    clock = [1000.0]
    out: list[str] = []
    bar = progress.Tqdm(len(steps), desc=None if descs else progress.SHARDS_DESC_059, bar_format=fmt,
                        write=out.append, clock=lambda: clock[0], tty_fd=None)
    for i, step in enumerate(steps):
        if descs:
            bar.set_description(progress.capture_desc(descs[i], 70 - i / 7))
        clock[0] += step
        bar.iterated()
    bar.close()
    for k in env:
        monkeypatch.delenv(k)
    return "".join(out)


def test_lines_match_public_sglang_logs() -> None:
    desc = progress.capture_desc(4, 23.12)
    assert desc == "Capturing batches (bs=4 avail_mem=23.12 GB)"
    line = progress.format_meter(1, 4, 0.16, prefix=desc + ": ", rate=6.18)
    assert line == "Capturing batches (bs=4 avail_mem=23.12 GB):  25%|██▌       | 1/4 [00:00<00:00,  6.18it/s]"
    line = progress.format_meter(0, 4, 0.0)
    assert line == "  0%|          | 0/4 [00:00<?, ?it/s]"
    line = progress.format_meter(2, 2, 2.4, prefix=progress.SHARDS_DESC_059, rate=1 / 1.24,
                                 bar_format=progress.SHARDS_BAR_FORMAT_059)
    assert line == "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.24s/it]\n"
    # 0.5.23 (the real server's bar, tests/verify/data/sglang-0.5.23-cpu/normal.log)
    line = progress.format_meter(1, 1, 0.0012, prefix=progress.SHARDS_DESC, rate=823.54,
                                 bar_format=progress.SHARDS_BAR_FORMAT)
    assert line == "Multi-thread loading shards: 100% Completed | 1/1 [00:00<00:00, 823.54it/s]"
    line = progress.format_meter(3, 4, 4.2, prefix="Capturing batches (bs=2 avail_mem=18.62 GB): ", rate=1 / 1.15)
    assert line == "Capturing batches (bs=2 avail_mem=18.62 GB):  75%|███████▌  | 3/4 [00:04<00:01,  1.15s/it]"


def test_capture_writes_carriage_returns_and_one_newline_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    text = emulate(None, [4, 2, 1], [0.2, 0.2, 0.2], {}, monkeypatch)
    assert text.count("\n") == 1 and text.endswith("\n")
    parts = text[:-1].split("\r")[1:]
    assert parts[0] == "  0%|          | 0/3 [00:00<?, ?it/s]"
    assert parts[1] == "Capturing batches (bs=4 avail_mem=70.00 GB):   0%|          | 0/3 [00:00<?, ?it/s]"
    assert parts[-1].startswith("Capturing batches (bs=1 avail_mem=69.71 GB): 100%|██████████| 3/3 [00:00<00:00,")


def test_0523_shards_are_one_record_closed_by_one_newline() -> None:
    text = emulate_updates([0.01])
    assert text == ("\rMulti-thread loading shards:   0% Completed | 0/1 [00:00<?, ?it/s]"
                    "\rMulti-thread loading shards: 100% Completed | 1/1 [00:00<00:00, 100.00it/s]\n")


def test_059_shards_end_each_update_with_a_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    text = emulate(progress.SHARDS_BAR_FORMAT_059, None, [0.3, 0.3], {}, monkeypatch)
    lines = text.split("\n")
    assert lines[0] == "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"
    assert lines[1] == "\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:00<00:00,  3.33it/s]"
    assert lines[2] == lines[3]
    assert lines[2] == "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:00<00:00,  3.33it/s]"
    assert lines[4:] == ["", ""]  # close()'s own newline after the last update


VLLM_PYTHON = Path("/var/cache/gpudeploy-lab/engines/vllm/venv/bin/python3")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_bytes_as_real_tqdm(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no real tqdm to compare with: {VLLM_PYTHON} is not built (python -m gpudeploy_lab engine)")
    fmt, descs, steps, env = SCENARIOS[name]
    scenario = {"fmt": fmt, "descs": descs, "steps": steps,
                "desc": None if descs else progress.SHARDS_DESC_059}
    run_env = {"PATH": "/usr/bin:/bin", **env}
    r = subprocess.run([str(VLLM_PYTHON), "-c", REAL, json.dumps(scenario)], env=run_env,
                       capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    real = json.loads(r.stdout)
    assert emulate(fmt, descs, steps, env, monkeypatch) == real


@pytest.mark.parametrize("name", sorted(UPDATE_SCENARIOS))
def test_0523_shard_bar_same_bytes_as_real_tqdm(name: str) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no real tqdm to compare with: {VLLM_PYTHON} is not built (python -m gpudeploy_lab engine)")
    steps = UPDATE_SCENARIOS[name]
    scenario = {"fmt": progress.SHARDS_BAR_FORMAT, "descs": None, "steps": steps, "desc": progress.SHARDS_DESC,
                "update": True}
    r = subprocess.run([str(VLLM_PYTHON), "-c", REAL, json.dumps(scenario)], env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    assert emulate_updates(steps) == json.loads(r.stdout)
