"""Status shows what each unit's GPUs draw and how busy they are, where NVML is present (issue 25),
and says so when the NVML is a stand-in's."""

from __future__ import annotations

from types import SimpleNamespace

from gpudeploy.facts.remote_probe import load_record
from gpudeploy.report import status_text
from gpudeploy.verify.status import UnitStatus, gpu_load

GIB = 2**30


def test_nvml_raw_values_become_watts_and_percent() -> None:
    assert load_record(412_345, 700_000, SimpleNamespace(gpu=63, memory=21)) == {
        "power_w": 412.3, "power_limit_w": 700.0, "sm_util_pct": 63.0, "mem_util_pct": 21.0}
    # NotSupported (a VM, an old board): unknown, never 0
    assert load_record(None, None, None) == {"power_w": None, "power_limit_w": None, "sm_util_pct": None,
                                             "mem_util_pct": None}


def devices() -> dict[str, object]:
    return {"standin": None, "devices": [
        {"index": i, "used": (10 + i) * GIB, "power_w": 100.0 + 100 * i, "power_limit_w": 700.0,
         "sm_util_pct": 10.0 * i, "mem_util_pct": 5.0} for i in range(4)]}


def test_a_units_gpus_are_the_ones_shown() -> None:
    load, standin = gpu_load(devices(), {2, 3})
    assert sorted(load) == [2, 3] and standin is None
    assert load[3] == {"power_w": 400.0, "power_limit_w": 700.0, "sm_util_pct": 30.0, "mem_util_pct": 5.0,
                       "used_gib": 13.0}
    assert gpu_load({"error": "NVML init failed", "devices": []}, {0}) == ({}, None)


def test_status_prints_power_and_utilisation_per_gpu_and_the_total() -> None:
    s = UnitStatus("n1", "gpudeploy-d.decode.service", "decode", "d", "active/running", 42, 10.0,
                   {"http": 30010}, "200", True, True)
    s.gpu_load, s.gpu_standin = gpu_load(devices(), {2, 3})
    text, ok = status_text({"n1": [s]})
    assert ok
    assert "n1/decode: power and utilisation now: GPU 2 300/700 W SM 20%, GPU 3 400/700 W SM 30%; 700 W in all" \
        in text, text
    fake = dict(devices(), standin="the lab's stand-in NVML")
    s.gpu_load, s.gpu_standin = gpu_load(fake, {2})
    assert "GPU 2 300/700 W SM 20% (a stand-in NVML: modelled, not measured)" in status_text({"n1": [s]})[0]
    doc = s.to_json()
    assert doc["gpus"] == {"2": s.gpu_load[2]} and doc["gpu_standin"] == "the lab's stand-in NVML"
