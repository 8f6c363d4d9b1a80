"""The fake NVML (lab/shims/pynvml.py) and the stand-in's memory model (pure)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from standin_support import GPU_BYTES, PYTHON, REPO, Lab

from gpudeploy_lab.standin.memory import (
    EngineSettings,
    ModelInfo,
    default_mem_fraction,
    graph_batch_sizes,
    plan_engine,
    read_model_info,
)

GIB = 1 << 30


@pytest.fixture
def nvml(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The shim loaded under its own name (the venv has the real pynvml)."""
    monkeypatch.setenv("GPUDEPLOY_LAB_GPUS", str(lab.gpus_json))
    monkeypatch.setenv("SGLANG_STANDIN_GPU_PROCS_DIR", str(lab.procs_dir))
    spec = importlib.util.spec_from_file_location("fake_pynvml", REPO / "lab/shims/pynvml.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod


def write_record(lab: Lab, pid: int, gpu: int, used: int) -> None:
    lab.procs_dir.mkdir(exist_ok=True)
    (lab.procs_dir / f"{pid}.json").write_text(json.dumps({"pid": pid, "gpu": gpu, "used_bytes": used}))


def test_nvml_lists_live_processes_and_ignores_dead_ones(lab: Lab, nvml: ModuleType) -> None:
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    write_record(lab, os.getpid(), 1, 6 * GIB)
    write_record(lab, dead.pid, 1, 50 * GIB)
    write_record(lab, os.getppid(), 2, 1 * GIB)

    nvml.nvmlInit()
    assert nvml.nvmlSystemGetDriverVersion() == "580.159.04"
    assert nvml.nvmlDeviceGetCount() == 4
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA H200"
    assert nvml.nvmlDeviceGetUUID(h).startswith("GPU-00000001")
    assert nvml.nvmlDeviceGetPciInfo(h).busId == "00000000:00:07.0"
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(os.getpid(), 6 * GIB)]
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == GPU_BYTES and mem.used == 644_939_776 + 6 * GIB and mem.free == mem.total - mem.used
    idle = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    assert idle.used == 644_939_776 and nvml.nvmlDeviceGetComputeRunningProcesses(
        nvml.nvmlDeviceGetHandleByIndex(0)) == []
    assert nvml.nvmlDeviceGetNumaNodeId(h) == 0
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(9)
    nvml.nvmlShutdown()


def test_nvml_without_driver_and_numa_not_supported(lab: Lab, nvml: ModuleType,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(lab.gpus_json.read_text())
    data["gpus"][0]["numa_node"] = None
    lab.gpus_json.write_text(json.dumps(data))
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_NotSupported) as e:
        nvml.nvmlDeviceGetNumaNodeId(nvml.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(e.value, nvml.NVMLError) and e.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
    nvml.nvmlShutdown()
    monkeypatch.setenv("GPUDEPLOY_LAB_GPUS", str(lab.tmp / "absent.json"))
    with pytest.raises(nvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_shim_imports_as_pynvml_under_debian_python(lab: Lab) -> None:
    code = ("import pynvml; pynvml.nvmlInit(); "
            "print(pynvml.__file__, pynvml.nvmlDeviceGetCount())")
    r = subprocess.run([PYTHON, "-c", code], env=lab.env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(REPO / "lab/shims/pynvml.py"), "4"]


# ------------------------------------------------------------------------------ memory model


def test_default_fraction_matches_the_reference_formula() -> None:
    s = EngineSettings(tp=4)
    assert default_mem_fraction(96 * 1024, s, 8192, 512) == pytest.approx(0.854, abs=0.001)
    eagle = EngineSettings(tp=4, speculative_algorithm="EAGLE")
    assert default_mem_fraction(96 * 1024, eagle, 8192, 512) == pytest.approx(0.833, abs=0.001)
    assert len(graph_batch_sizes(512)) == 52 and graph_batch_sizes(16) == (1, 2, 4, 8, 12, 16)


def test_model_facts_from_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "max_position_embeddings": 131072}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16 * GIB}}))
    m = read_model_info(str(tmp_path), None, None, tp=1)
    assert (m.kv_bytes_per_token, m.weights_bytes, m.context_len) == (131072, 16 * GIB, 131072)
    assert read_model_info(str(tmp_path), None, None, tp=8).kv_bytes_per_token == 131072 // 8
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64}))
    mla = read_model_info(str(tmp_path), 10, None, tp=8)
    assert mla.mla and mla.kv_bytes_per_token == 70272


def plan(frac: float | None = 0.8, weights_gib: float = 16, others: int = 0, tp: int = 1,
         **kw: object) -> object:
    s = EngineSettings(tp=tp, mem_fraction_static=frac, **kw)  # type: ignore[arg-type]
    m = ModelInfo(weights_bytes=int(weights_gib * GIB), kv_bytes_per_token=65536)
    gpus = [(r, r, GPU_BYTES) for r in range(tp)]
    return plan_engine(s, m, gpus, {0: others})


def test_natural_failures_follow_the_memory_model() -> None:
    ok = plan()
    assert ok.failure is None and ok.max_total_num_tokens > 0  # type: ignore[attr-defined]
    assert plan(frac=0.1).failure.phase == "kv"  # type: ignore[attr-defined]
    assert plan(weights_gib=300).failure.phase == "weights"  # type: ignore[attr-defined]
    assert plan(frac=0.995).failure.phase == "graph"  # type: ignore[attr-defined]
    # an orphan holding most of GPU 0 makes TP2 unbalanced
    unbalanced = plan(tp=2, others=60 * GIB).failure  # type: ignore[attr-defined]
    assert unbalanced.phase == "init" and "memory capacity is unbalanced" in unbalanced.message


def test_nvml_power_and_utilisation_are_plausible_and_say_they_are_modelled(lab: Lab, nvml: ModuleType) -> None:
    """An H200 with nothing on it idles at 77 W; one whose process holds memory but sleeps draws ~118 W
    (both measured on a real H200);
    one whose process (or the engine that started it) burns a CPU reads busy and draws more, never over
    its limit (issue 25)."""
    # the sleeper is orphaned (its parent, which would count as its engine, exits at once)
    orphan = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                            check=True)
    sleeper_pid = int(orphan.stdout)
    data = json.loads(lab.gpus_json.read_text())
    data["gpus"][3]["name"] = "NVIDIA RTX PRO 6000 Blackwell Server Edition (stand-in)"
    lab.gpus_json.write_text(json.dumps(data))
    started = [sleeper_pid]  # the PIDs we started, ended by PID at the end
    burner = subprocess.Popen([PYTHON, "-c", "import subprocess, time\nw = subprocess.Popen(['sleep', '30'])\n"
                               "print(w.pid, flush=True)\nt = time.time() + 30\nwhile time.time() < t: pass\n"
                               "w.kill()"], stdout=subprocess.PIPE, text=True)
    try:
        write_record(lab, sleeper_pid, 1, 20 * GIB)
        write_record(lab, burner.pid, 2, 20 * GIB)
        nvml.nvmlInit()
        assert "stand-in" in nvml.STANDIN and "not measured" in nvml.STANDIN
        h0, h1, h2 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 2))
        assert nvml.nvmlDeviceGetEnforcedPowerLimit(h0) == 700_000  # mW, the H200 SXM's
        deadline = time.monotonic() + 10
        while True:  # the burner's share of a CPU since the last reading, once it has run a while
            time.sleep(0.3)
            busy = nvml.nvmlDeviceGetUtilizationRates(h2)
            if busy.gpu >= 20 or time.monotonic() > deadline:  # >= 10 % of a CPU, on a busy machine too
                break
        assert busy.gpu >= 20 and abs(busy.memory - busy.gpu * 0.6) <= 1, busy
        power = nvml.nvmlDeviceGetPowerUsage(h2)  # the same sample: 117.8 W + 98 % of the other 582.2 W x busy
        assert abs(power - (117_810 + 0.98 * 582_190 * busy.gpu / 100)) <= 0.01 * 582_190, (power, busy)
        assert power <= 700_000
        assert nvml.nvmlDeviceGetPowerUsage(h0) == 77_000
        assert nvml.nvmlDeviceGetUtilizationRates(h0).gpu == 0
        time.sleep(0.3)
        idle_held = nvml.nvmlDeviceGetPowerUsage(h1)
        assert 117_810 <= idle_held < 125_000, idle_held
        # a sleeping TP worker whose engine serves (burns CPU) counts as busy: the engine's work is its GPU's
        assert burner.stdout is not None
        worker = int(burner.stdout.readline())
        started.append(worker)
        write_record(lab, worker, 3, 20 * GIB)
        h3 = nvml.nvmlDeviceGetHandleByIndex(3)
        assert nvml.nvmlDeviceGetUtilizationRates(h3).gpu >= 20
        assert nvml.nvmlDeviceGetEnforcedPowerLimit(h3) == 600_000  # the lab's board: the field's 600 W card
        nvml.nvmlShutdown()
    finally:
        burner.kill()
        burner.wait()
        for pid in started:
            os.kill(pid, 9)
