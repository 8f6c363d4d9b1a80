"""A GPU's health as the host probe reads it (facts/gpu_health.py): NVML's answers decoded, the driver's
Xid lines parsed from each kernel-log form and mapped to the GPU's index, and a lost GPU reported, never
the end of the probe. NVML is faked with the answers of a real H100 (shared/reference/h100-gpu-health-probe.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpudeploy.facts import gpu_health as gh
from gpudeploy.facts import remote_probe


def test_the_clock_event_reasons_bit_mask_reads_as_words() -> None:
    assert gh.decode_clock_reasons(0) == []
    assert gh.decode_clock_reasons(0x1) == ["idle"]  # the idle H100 of the probe
    assert gh.decode_clock_reasons(0x4) == ["sw_power_cap"]  # a busy GPU at its power limit: normal
    assert gh.decode_clock_reasons(0x8 | 0x40 | 0x80) == ["hw_slowdown", "hw_thermal_slowdown",
                                                          "hw_power_brake_slowdown"]
    assert gh.decode_clock_reasons(0x20 | 0x100) == ["sw_thermal_slowdown", "display_clock_setting"]
    assert gh.decode_clock_reasons(0x1 | 0x1000) == ["idle", "0x1000"]  # a bit named after this table: kept


@pytest.mark.parametrize(("line", "bus", "xid", "pid", "name"), [
    # R470 and later, with the process
    ("NVRM: Xid (PCI:0000:41:00): 79, pid=2451, name=python3, GPU has fallen off the bus.", "0000:41:00", 79, 2451,
     "python3"),
    # what a 2026 driver wrote for a GPU that fell off (NVIDIA/open-gpu-kernel-modules#1151)
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", "0000:2b:00", 79, None, None),
    # an older driver: no "PCI:"
    ("NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d 00000104 00000000 00000100", "0000:01:00", 13, None, None),
    # a domain other than 0 (a GB200), and a recovery action
    ("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
     "0009:01:00", 154, None, None),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "0000:10:1c", 63, 1896, None),
    ("NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, DBE", "0000:41:00", 48, None, None),
    # dmesg's own stamp in front
    ("[ 966.503025] NVRM: Xid (PCI:0000:01:00): 31, Ch 0000000b, engmask 00000120", "0000:01:00", 31, None, None),
])
def test_each_form_of_an_xid_line_is_read(line: str, bus: str, xid: int, pid: int | None, name: str | None) -> None:
    x = gh.parse_xid(line)
    assert x is not None
    assert (x["bus"], x["xid"], x["pid"], x["name"]) == (bus, xid, pid, name)
    assert x["text"].startswith("NVRM: Xid (")


@pytest.mark.parametrize("line", [
    "NVRM: GPU at PCI:0000:41:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
    "NVRM: Persistence mode is deprecated and will be removed in a future release.",
    "NVRM: Xid (PCI:zz:yy): 79, garbage",
])
def test_other_kernel_lines_are_not_xids(line: str) -> None:
    assert gh.parse_xid(line) is None


def test_every_spelling_of_a_pci_address_names_the_same_gpu() -> None:
    same = {gh.bus_key(b) for b in ("00000000:41:00.0", "0000:41:00.0", "PCI:0000:41:00", "0000:41:00", "41:00")}
    assert same == {"0000:41:00"}
    assert gh.bus_key("00000000:1A:00.0") == "0000:1a:00"  # NVML's capitals, an Xid's lower case
    assert gh.bus_key("00000009:01:00.0") == "0009:01:00" != gh.bus_key("0000:01:00")
    assert gh.bus_key("not a bus") is None


def test_an_xid_is_mapped_to_the_nvml_index_of_its_bus() -> None:
    buses = {0: "00000000:1A:00.0", 1: "00000000:3C:00.0", 3: "00000000:41:00.0"}
    xids = [{"bus": "0000:41:00", "xid": 79}, {"bus": "0000:1a:00", "xid": 48}, {"bus": "0000:99:00", "xid": 13}]
    assert [x["gpu"] for x in gh.map_xids(xids, buses)] == [3, 0, None]
    # a lost GPU answers no NVML call, not even its bus id: the one Xid no known GPU claims is its
    assert [x["gpu"] for x in gh.map_xids(xids, {**buses, 2: ""})] == [3, 0, 2]
    assert [x["gpu"] for x in gh.map_xids(xids, {**buses, 2: "", 4: ""})] == [3, 0, None]  # two unknown: no guess


def test_each_kernel_log_form_gives_the_hosts_time() -> None:
    assert gh.parse_short_unix("1765103024.123456 node7 kernel: NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen "
                               "off the bus.") == (1765103024.123456, "NVRM: Xid (PCI:0000:41:00): 79, GPU has "
                                                                      "fallen off the bus.")
    assert gh.parse_short_unix("1765103024.123456 node7 sshd[812]: Accepted publickey") is None  # not the kernel's
    assert gh.parse_kmsg("4,1234,5301234567,-;NVRM: Xid (PCI:0000:41:00): 79, x\n SUBSYSTEM=pci\n", 1000.0) == \
        (1000.0 + 5301.234567, "NVRM: Xid (PCI:0000:41:00): 79, x")
    assert gh.parse_dmesg("[ 5301.234567] NVRM: Xid (0000:41:00): 79, x", 1000.0) == (6301.234567,
                                                                                      "NVRM: Xid (0000:41:00): 79, x")
    assert gh.parse_kmsg("not a record", 0.0) is None and gh.parse_dmesg("no stamp", 0.0) is None


def _done(stdout: str, rc: int = 0) -> Any:
    return SimpleNamespace(returncode=rc, stdout=stdout, stderr="")


def test_the_journal_is_read_where_it_carries_the_kernels_lines(tmp_path: Path) -> None:
    asked: list[list[str]] = []
    journal = ("1765103000.000001 node7 kernel: Linux version 6.8.0\n"
               "1765103024.500000 node7 kernel: NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.\n")

    def run(argv: list[str], **kw: Any) -> Any:
        asked.append(argv)
        return _done(journal)

    source, error, lines = gh.kernel_lines(1765103010.0, run=run, kmsg=str(tmp_path / "none"))
    assert (source, error) == ("journal", None)
    assert lines == [(1765103024.5, "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.")]
    assert "--since" in asked[-1] and "@1765103010" in asked[-1] and "-k" in asked[-1]


def test_without_a_journal_or_kmsg_it_says_why_and_reads_nothing(tmp_path: Path) -> None:
    # a container: journalctl has no kernel lines, no /dev/kmsg, dmesg refused
    def run(argv: list[str], **kw: Any) -> Any:
        if argv[0] == "dmesg":
            return SimpleNamespace(returncode=1, stdout="", stderr="dmesg: read kernel buffer failed: Operation "
                                                                    "not permitted")
        return _done("")

    source, error, lines = gh.kernel_lines(0.0, run=run, kmsg=str(tmp_path / "kmsg"))
    assert source is None and lines == []
    assert error is not None and "the journal has no kernel lines here" in error
    assert "kmsg: No such file or directory" in error and "Operation not permitted" in error


def test_an_nvml_stand_in_names_the_file_that_is_its_kernel_log(tmp_path: Path) -> None:
    log = tmp_path / "kernel.log"
    log.write_text("1765103000.5 lab2 kernel: NVRM: Xid (PCI:0000:1a:00): 48, pid=7, name=python3, DBE\n"
                   "1765103100.5 lab2 kernel: NVRM: Xid (PCI:0000:3c:00): 79, GPU has fallen off the bus.\n")
    source, error, lines = gh.kernel_lines(1765103050.0, str(log))
    assert (source, error) == (str(log), None)
    assert [gh.parse_xid(m)["xid"] for _, m in lines] == [79]  # type: ignore[index]
    assert gh.kernel_lines(0.0, str(tmp_path / "never-written"))[1:] == (None, [])


class FakeNvml:
    """nvidia-ml-py as a real H100 answered it (h100-gpu-health-probe.md); ``broken`` raise instead."""

    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, **broken: BaseException) -> None:
        self.broken = broken

    def __getattr__(self, name: str) -> Any:
        answers: dict[str, Any] = {
            "nvmlDeviceGetRemappedRows": (0, 0, 0, 0), "nvmlDeviceGetEccMode": [1, 1],
            "nvmlDeviceGetTotalEccErrors": 0, "nvmlDeviceGetCurrentClocksEventReasons": 1,
            "nvmlDeviceGetTemperature": 34, "nvmlDeviceGetCurrPcieLinkGeneration": 5,
            "nvmlDeviceGetMaxPcieLinkGeneration": 5, "nvmlDeviceGetCurrPcieLinkWidth": 16,
            "nvmlDeviceGetMaxPcieLinkWidth": 16}
        unsupported = ("nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus",
                       "nvmlDeviceGetNvLinkState")
        if name in self.broken:
            exc = self.broken[name]

            def fail(*a: Any) -> Any:
                raise exc
            return fail
        if name in unsupported:
            return _raises(3)
        if name in answers:
            return lambda *a: answers[name]
        raise AttributeError(name)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__({3: "Not Supported", 15: "GPU is lost", 16: "GPU requires restart"}.get(value, "?"))
        self.value = value


def _raises(code: int) -> Any:
    def fail(*a: Any) -> Any:
        raise NVMLError(code)
    return fail


def test_a_healthy_h100_reads_as_the_real_one_answered() -> None:
    assert gh.device_health(FakeNvml(), "h") == {
        "lost": False, "reset_required": False,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "retired_pages": None,  # NotSupported: row remapping replaces it
        "ecc": {"enabled": True, "uncorrected_volatile": 0, "uncorrected_aggregate": 0, "corrected_volatile": 0},
        "clocks_event_reasons": {"mask": 1, "reasons": ["idle"]}, "temperature_c": 34,
        "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}, "nvlink": None}


def test_a_function_an_older_nvidia_ml_py_lacks_is_unknown_not_an_error() -> None:
    class Old(FakeNvml):
        def __getattr__(self, name: str) -> Any:
            if name in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksEventReasons"):
                raise AttributeError(name)
            if name == "nvmlDeviceGetCurrentClocksThrottleReasons":
                return lambda *a: 0x48
            return super().__getattr__(name)

    h = gh.device_health(Old(), "h")
    assert h["remapped_rows"] is None and h["retired_pages"] is None  # NotSupported too: unknown
    assert h["clocks_event_reasons"] == {"mask": 0x48, "reasons": ["hw_slowdown", "hw_thermal_slowdown"]}


def test_a_gpu_lost_in_the_middle_of_its_reading_is_lost() -> None:
    h = gh.device_health(FakeNvml(nvmlDeviceGetTotalEccErrors=NVMLError(15)), "h")
    assert h == {"lost": True, "reset_required": False, "error": "NVMLError: GPU is lost"}
    assert gh.device_health(FakeNvml(nvmlDeviceGetTemperature=NVMLError(16)), "h")["reset_required"] is True


def test_nvlink_links_are_counted_until_nvml_says_there_is_no_such_link() -> None:
    class Sxm(FakeNvml):
        def __getattr__(self, name: str) -> Any:
            if name == "nvmlDeviceGetNvLinkState":
                def state(h: Any, link: int) -> int:
                    if link >= 18:
                        raise NVMLError(2)
                    return 0 if link == 5 else 1
                return state
            return super().__getattr__(name)

    assert gh.device_health(Sxm(), "h")["nvlink"] == {"links": 18, "active": 17, "down": [5]}


def test_the_probe_lists_a_lost_gpu_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a GPU that answers NVML_ERROR_GPU_IS_LOST raised out of the probe, which then returned no
    JSON at all (every GPU, every unit of the host unknown). Now it is listed as lost, the others read."""

    class Pci:
        def __init__(self, bus: str) -> None:
            self.busId = bus

    class Mem:
        total, used, free = 85 * 2**30, 2**29, 85 * 2**30 - 2**29

    def handle(i: int) -> int:
        if i == 1:
            raise NVMLError(15)
        return i

    fake = SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlDeviceGetCount=lambda: 3, nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetPciInfo=lambda h: Pci(f"00000000:4{h}:00.0"), nvmlDeviceGetMemoryInfo=lambda h: Mem(),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetNumaNodeId=_raises(3), nvmlDeviceGetPowerUsage=lambda h: 69900,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000, nvmlDeviceGetUtilizationRates=_raises(3),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        **{n: getattr(FakeNvml(), n) for n in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetEccMode",
                                               "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTemperature")})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = remote_probe.gpus()
    assert found["error"] is None and [d["index"] for d in found["devices"]] == [0, 1, 2]
    lost = found["devices"][1]
    assert lost["health"]["lost"] is True and lost["total"] is None and lost["bus_id"] == ""
    assert found["devices"][0]["health"]["lost"] is False and found["devices"][2]["bus_id"] == "00000000:42:00.0"


def test_facts_shows_each_health_field_and_the_xids_since_boot() -> None:
    from gpudeploy.facts.host import from_probe
    from gpudeploy.model import Host, NumaNode, SshConfig
    from gpudeploy.report import facts_text

    host = Host(name="h100", address="192.0.2.1", ssh=SshConfig(), numa_nodes=(NumaNode(0, (0, 1), "0-15"),),
                gpu_memory_gib={0: 80.0, 1: 80.0}, engine_versions={}, python="python3", bind_address="0.0.0.0",
                numa_policy="none", env={}, placements=())
    healthy = gh.device_health(FakeNvml(), "h")
    lost = remote_probe.lost_record(1, None, gh.lost_health(NVMLError(15)))
    facts = from_probe(host, {"gpus": {"devices": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "bus_id": "00000000:41:00.0", "numa_node": 0,
         "total": 80 * 2**30, "used": 2**29, "free": 79 * 2**30, "health": healthy}, lost], "processes": []},
        "xids": {"source": "journal", "error": None, "xids": [
            {"at": 1765103024.5, "bus": "0000:42:00", "gpu": 1, "xid": 79, "pid": None, "name": None,
             "text": "NVRM: Xid (PCI:0000:42:00): 79, GPU has fallen off the bus."}]}, "init": "systemd"})
    assert facts.to_json()["kernel_log"]["xids"][0]["gpu"] == 1
    text, _ = facts_text({"h100": facts}, {"h100": host})
    assert ("GPU 0: remapped rows 0 correctable/0 uncorrectable, pending no, failed no; ECC on, uncorrected 0 "
            "volatile/0 aggregate, corrected 0 volatile; clocks idle; 34 C; PCIe gen5 x16 of gen5 x16; NVLink none"
            ) in text, text
    assert "GPU 1: LOST (NVMLError: GPU is lost)" in text
    assert "    LOST: GPU 1 is lost (NVML answers NVML_ERROR_GPU_IS_LOST" in text
    assert "kernel log (journalctl -k): 1 Xid line(s) since boot:" in text
    assert "GPU 1 (0000:42:00.0) reported Xid 79, fell off the bus, at " in text
    assert "      | NVRM: Xid (PCI:0000:42:00): 79, GPU has fallen off the bus." in text
