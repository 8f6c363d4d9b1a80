"""The installed release's own memory defaults: deploy asks the host's SGLang once per release, GPU and
launch and keeps the answer; `plan` offline then uses it and says so, and without one uses the
captured rules and says that. The host is a recorded probe answer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy import defaultscache
from gpudeploy.apply import ask_defaults
from gpudeploy.plan import load_plan

LLAMA_70B = {"kind": "mha", "weights_bytes": 141107412992, "layers": 80, "kv_heads": 8, "head_dim": 128,
             "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256, "context_length": 131072}


def make(tmp: Path, version: str = "0.5.17", settings: dict[str, Any] | None = None) -> Path:
    (tmp / "roles").mkdir(exist_ok=True)
    (tmp / "roles" / "srv.yml").write_text(yaml.safe_dump(
        {"engine": "sglang", "tp_size": 4, "model": {"path": "/models/llama", "facts": LLAMA_70B},
         "settings": settings or {}}))
    inv = tmp / "hosts.yml"
    inv.write_text(yaml.safe_dump({
        "deployment": "m", "roles_dir": "roles",
        "defaults": {"gpu_memory_gib": 79.6, "engine_versions": {"sglang": version}, "ssh": {"port": 1}},
        "hosts": {"node1": {"address": "127.0.0.1", "roles": ["srv"], "numa_nodes": [
            {"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"}]}}}))
    return inv


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "defaults"
    monkeypatch.setattr(defaultscache, "ROOT", folder)
    return folder


def plan_of(inv: Path) -> Any:
    # as `plan` does: a release whose --help was not read yet plans with the nearest captured flags
    return load_plan(str(inv), offline_flags=True)


def inputs(mem: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in mem["inputs"]}


def test_without_an_answer_the_captured_rules_are_used_and_said(tmp_path: Path, cache: Path) -> None:
    mem = plan_of(make(tmp_path)).units[0].memory
    assert mem is not None and mem["release_rules"] == "0.5.17"
    said = inputs(mem)["release defaults"]
    assert not said["grounded"] and "0.5.10's rules for 0.5.17" in said["source"]
    assert "deploy" in said["certain_by"]
    # a release whose wheel was read needs no answer to be grounded: nothing is said of its defaults
    assert "release defaults" not in inputs(plan_of(make(tmp_path, "0.5.23")).units[0].memory or {})


def test_an_answer_kept_is_the_plans_defaults_offline(tmp_path: Path, cache: Path) -> None:
    inv = make(tmp_path)
    unit = plan_of(inv).units[0]
    before = unit.memory
    assert before is not None
    args = defaultscache.launch_args(unit.argv)
    assert "--port" not in args and "--host" not in args and args[:2] == ["--model-path", "/models/llama"]
    # what 0.5.17 said on a host with these GPUs (79.6 GiB by NVML: 81510.4 MiB)
    defaultscache.save("sglang", "0.5.17", 79.6 * 1024, args,
                       {"release": "0.5.17", "mem_fraction_static": 0.81, "chunked_prefill_size": 8192,
                        "cuda_graph_max_bs": 384, "max_running_requests": None}, "node1")
    mem = plan_of(inv).units[0].memory
    assert mem is not None
    assert mem["fraction"] == 0.81 != before["fraction"] and mem["fraction_is_default"]
    assert mem["cuda_graph_max_bs"] == 384
    said = inputs(mem)["release defaults"]
    assert said["grounded"] and said["source"].startswith("asked of sglang 0.5.17 on node1 on ")
    # the role's own setting wins over the release's default
    mine = plan_of(make(tmp_path, settings={"cuda_graph_max_bs": 128})).units[0].memory
    assert mine is not None and mine["cuda_graph_max_bs"] == 128


def _host_answers(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], asked: list[dict[str, Any]]) -> None:
    @contextmanager
    def connect(host: Any) -> Iterator[Any]:
        yield host

    def probe(remote: Any, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        asked.append(spec)
        return {"defaults": [dict(answer) for _ in spec["defaults"]]}

    monkeypatch.setattr(ask_defaults, "connect", connect)
    monkeypatch.setattr(ask_defaults, "probe", probe)


def test_deploy_asks_once_and_keeps_the_answer(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[dict[str, Any]] = []
    _host_answers(monkeypatch, {"release": "0.5.17", "gpu_mib": 81510.4, "mem_fraction_static": 0.812,
                                "chunked_prefill_size": 8192, "cuda_graph_max_bs": 512,
                                "max_running_requests": None}, asked)
    plan = plan_of(make(tmp_path))
    assert ask_defaults.ask(plan) == ["node1/srv"]
    (one,) = asked[0]["defaults"]
    assert one["gpu_mib"] == pytest.approx(79.6 * 1024) and one["gpus"] == "0,1,2,3"
    assert one["python"] == plan.units[0].argv[0] and "--port" not in one["args"]
    assert "asked sglang 0.5.17 for its memory defaults (srv): mem_fraction_static 0.812" in capsys.readouterr().out
    assert ask_defaults.ask(plan_of(make(tmp_path))) == [] and len(asked) == 1   # kept: not asked again
    mem = plan_of(make(tmp_path)).units[0].memory
    assert mem is not None and mem["fraction"] == 0.812


@pytest.mark.parametrize(("answer", "words"), [
    ({"release": "0.5.23", "mem_fraction_static": 0.8}, "reports sglang '0.5.23', not 0.5.17"),
    ({"release": "0.5.17", "mem_fraction_static": 7}, "mem_fraction_static is 7, outside"),
    ({"error": "exit 1: ModuleNotFoundError: No module named 'sglang'"}, "could not ask sglang 0.5.17"),
    # a python traceback from the host is said as its exception, never as a traceback
    ({"error": "exit 1: Traceback (most recent call last):\n  File \"<string>\", line 15, in <module>\n"
               "ModuleNotFoundError: No module named 'sglang.srt'"},
     "(srv): exit 1: ModuleNotFoundError: No module named 'sglang.srt'; the plan keeps"),
])
def test_an_answer_that_cannot_be_taken_is_said_and_the_rules_stay(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        answer: dict[str, Any], words: str) -> None:
    _host_answers(monkeypatch, answer, [])
    assert ask_defaults.ask(plan_of(make(tmp_path))) == []
    out = capsys.readouterr().out
    assert words in out and "Traceback" not in out
    mem = plan_of(make(tmp_path)).units[0].memory
    assert mem is not None and not inputs(mem)["release defaults"]["grounded"]


def test_a_host_that_cannot_answer_is_not_asked_again_by_the_next_deploy(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in or a python without SGLang answers nothing: a redeploy must not pay a connection
    and a probe for that again (the SSH overhead of every redeploy)."""
    asked: list[dict[str, Any]] = []
    _host_answers(monkeypatch, {"error": "exit 1: ModuleNotFoundError: No module named 'sglang.srt'"}, asked)
    assert ask_defaults.ask(plan_of(make(tmp_path))) == [] and len(asked) == 1
    assert ask_defaults.ask(plan_of(make(tmp_path))) == [] and len(asked) == 1


def test_a_server_on_the_cpu_is_never_asked_for_gpu_memory_defaults(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, Any]] = []
    _host_answers(monkeypatch, {"release": "0.5.17", "mem_fraction_static": 0.8}, asked)
    assert ask_defaults.ask(plan_of(make(tmp_path, settings={"device": "cpu"}))) == [] and asked == []


FIX = Path(__file__).resolve().parents[1] / "memory" / "fixtures"


def test_a_model_that_lives_only_on_the_host_is_read_there_once(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No model.facts and no folder here: the plan's memory check was "unknown". Deploy's probe reads
    config.json and the checkpoint's sizes on the host; the plan then checks the model with them and
    says where its size came from."""
    inv = make(tmp_path, "0.5.23")
    role = tmp_path / "roles" / "srv.yml"
    doc = yaml.safe_load(role.read_text())
    doc["model"] = {"path": "/models/only-on-node1/Llama-3.1-70B"}
    role.write_text(yaml.safe_dump(doc))
    assert (plan_of(inv).units[0].memory or {})["verdict"] == "unknown"
    config = yaml.safe_load((FIX / "llama-3.1-70b" / "config.json").read_text())
    answer = {"config": config, "checkpoint": {"total_bytes": 141107412992, "by_dtype": {"BF16": 141107412992},
                                              "source": "/models/only-on-node1/Llama-3.1-70B/model.safetensors."
                                                        "index.json metadata.total_size"}}
    asked: list[dict[str, Any]] = []

    @contextmanager
    def connect(host: Any) -> Iterator[Any]:
        yield host

    def probe(remote: Any, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        asked.append(spec)
        return {"defaults": [{"error": "exit 1: no sglang"}] * len(spec["defaults"]),
                "models": {p: answer for p in spec["models"]}}

    monkeypatch.setattr(ask_defaults, "connect", connect)
    monkeypatch.setattr(ask_defaults, "probe", probe)
    assert ask_defaults.ask(plan_of(inv)) == ["node1:/models/only-on-node1/Llama-3.1-70B"]
    assert asked[0]["models"] == ["/models/only-on-node1/Llama-3.1-70B"]
    mem = plan_of(inv).units[0].memory
    assert mem is not None and (mem["verdict"], mem["severity"]) == ("fits", "ok"), mem["reason"]
    size = inputs(mem)["checkpoint size"]
    assert size["grounded"] and "metadata.total_size, read on node1 on " in size["source"]
    assert ask_defaults.model_unread(plan_of(inv).units[0]) is None     # kept: not read again



def test_a_dp_attention_ranks_chunk_is_taken_back_to_the_whole() -> None:
    """SGLang resolves the chunk per DP rank (divided by the DP size); the model divides the whole
    chunk itself, so the asked one is multiplied back, not divided twice."""
    from gpudeploy.memory.asked import AskedDefaults, filled
    from gpudeploy.memory.settings import EngineSettings

    asked = AskedDefaults("0.5.17", "t", (("chunked_prefill_size", 1024), ("cuda_graph_max_bs", 64)))
    dp = EngineSettings(tp_size=8, enable_dp_attention=True, dp_size=8)
    assert filled(dp, asked).chunked_prefill_size == 8192 and filled(dp, asked).cuda_graph_max_bs == 64
    assert filled(EngineSettings(tp_size=8), asked).chunked_prefill_size == 1024


def test_plan_says_which_host_gave_the_defaults(tmp_path: Path, cache: Path) -> None:
    from gpudeploy.report import plan_text

    inv = make(tmp_path)
    unit = plan_of(inv).units[0]
    defaultscache.save("sglang", "0.5.17", 79.6 * 1024, defaultscache.launch_args(unit.argv),
                       {"release": "0.5.17", "mem_fraction_static": 0.81}, "node1")
    text = plan_text(plan_of(inv))
    assert "              release defaults: asked of sglang 0.5.17 on node1 on " in text


def test_replicas_of_one_launch_on_a_host_are_asked_once(tmp_path: Path, cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inv = make(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["node1"]["numa_nodes"] = [{"id": 0, "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "cpus": "0-31"}]
    doc["hosts"]["node1"]["roles"] = [{"role": "srv", "name": "srv-a", "gpus": [0, 1, 2, 3]},
                                      {"role": "srv", "name": "srv-b", "gpus": [4, 5, 6, 7]}]
    inv.write_text(yaml.safe_dump(doc))
    asked: list[dict[str, Any]] = []
    _host_answers(monkeypatch, {"release": "0.5.17", "mem_fraction_static": 0.812}, asked)
    plan = plan_of(inv)
    assert len(plan.units) == 2
    assert len(ask_defaults.ask(plan)) == 1 and len(asked[0]["defaults"]) == 1
    assert all((u.memory or {})["fraction"] == 0.812 for u in plan_of(inv).units)
