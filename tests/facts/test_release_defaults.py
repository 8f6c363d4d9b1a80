"""Deploy's probe asks the installed SGLang release for its own memory defaults: it resolves the
release's ServerArgs with the unit's arguments and the GPU memory it is given (not what nvidia-smi
says there), offline, and answers per ask, or its error, never the probe's failure.

The releases here are stand-ins with SGLang's own shapes (0.5.10: resolved in ``__post_init__``,
``get_device_memory_capacity`` imported by name into server_args; 0.5.23: ``resolve_once``, the name
imported into ``arg_groups/memory_hook``, the decode cap in ``cuda_graph_config.decode.max_bs``), and
fake pythons that print what the probe would read."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeploy.facts import probe, remote_probe

# the 0.5.10 shape: server_args.py:41 imports the helper by name, :781 calls it in __post_init__
R0510 = {
    "sglang/__init__.py": "__version__ = '0.5.10'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils.py": "def get_device_memory_capacity(device=None):\n    return 1.0\n",
    "sglang/srt/server_args.py": """\
from sglang.srt.utils import get_device_memory_capacity

class ServerArgs:
    def __init__(self, argv):
        self.tp_size = int(argv[argv.index('--tp-size') + 1]) if '--tp-size' in argv else 1
        self.mem_fraction_static = None
        self.chunked_prefill_size = None
        self.cuda_graph_max_bs = None
        self.max_running_requests = None
        self.__post_init__()

    def __post_init__(self):
        gpu_mem = get_device_memory_capacity()
        self.chunked_prefill_size = 8192 if gpu_mem < 160 * 1024 else 16384
        self.cuda_graph_max_bs = 256 if self.tp_size < 4 else 512
        reserved = 512 + self.chunked_prefill_size * 1.5 + self.cuda_graph_max_bs * 2 + self.tp_size / 8 * 1024
        self.mem_fraction_static = round((gpu_mem - max(reserved, 10240)) / gpu_mem, 3)

def prepare_server_args(argv):
    print('[2026-12-07 10:00:00] a log line on stdout')
    return ServerArgs(argv)
""",
}

# the 0.5.23 shape: __post_init__ does nothing, resolve_once runs the pipeline, memory_hook.py:21
# imports the helper by name, the decode cap lives in cuda_graph_config.decode.max_bs
R0523 = {
    "sglang/__init__.py": "__version__ = '0.5.23'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils/__init__.py": "from sglang.srt.utils.common import get_device_memory_capacity\n",
    "sglang/srt/utils/common.py": "def get_device_memory_capacity(device=None):\n    return None\n",
    "sglang/srt/arg_groups/__init__.py": "",
    "sglang/srt/arg_groups/overrides.py": """\
def resolution_result(server_args, field, default=None):
    return server_args._declared.get(field, getattr(server_args, field, default))
""",
    "sglang/srt/arg_groups/memory_hook.py": """\
import types
from sglang.srt.utils.common import get_device_memory_capacity

def handle_gpu_memory_settings(server_args):
    gpu_mem = get_device_memory_capacity('cuda')
    decode = types.SimpleNamespace(max_bs=None if gpu_mem is None else 512)
    server_args._declared['cuda_graph_config'] = types.SimpleNamespace(decode=decode)
    server_args._declared['chunked_prefill_size'] = 4096 if gpu_mem is None else 8192
    server_args._declared['mem_fraction_static'] = 0.95 if gpu_mem is None else round((gpu_mem - 14336) / gpu_mem, 3)
""",
    "sglang/srt/server_args.py": """\
class ServerArgs:
    def __init__(self, argv):
        self._declared = {}
        self.max_running_requests = 48 if '--speculative-algorithm' in argv else None

    def __post_init__(self):
        pass

    def resolve_once(self):
        from sglang.srt.arg_groups.memory_hook import handle_gpu_memory_settings
        handle_gpu_memory_settings(self)

def prepare_server_args(argv):
    return ServerArgs(argv)
""",
}


def _release(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_0_5_10_release_is_asked_with_the_gpu_memory_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_release(tmp_path, R0510)))
    got = remote_probe.release_defaults([{"python": sys.executable, "gpu_mib": 81559.0,
                                          "args": ["--model-path", "/m", "--tp-size", "4"]}])
    # 81559 MiB (an H100 80GB's nvidia-smi total): the release's own formula, not the stand-in's 1.0
    assert got == [{"release": "0.5.10", "gpu_mib": 81559.0, "cuda_graph_max_bs": 512, "mem_fraction_static": 0.824,
                    "chunked_prefill_size": 8192, "max_running_requests": None}]


def test_a_0_5_23_release_is_resolved_once_and_its_decode_cap_read(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_release(tmp_path, R0523)))
    got = remote_probe.release_defaults([{"python": sys.executable, "gpu_mib": 143771.0,
                                          "args": ["--model-path", "/m", "--speculative-algorithm", "EAGLE"]}])
    assert got == [{"release": "0.5.23", "gpu_mib": 143771.0, "cuda_graph_max_bs": 512, "mem_fraction_static": 0.9,
                    "chunked_prefill_size": 8192, "max_running_requests": 48}]


def _fake_python(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def test_the_fake_python_gets_the_arguments_offline_and_the_units_gpus(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    answer = {"release": "0.5.17", "gpu_mib": 97871.0, "mem_fraction_static": 0.83, "chunked_prefill_size": 8192,
              "cuda_graph_max_bs": 256, "max_running_requests": None}
    fake = _fake_python(tmp_path, f"""\
printf '%s\\n' "$5" "$HF_HUB_OFFLINE" "$CUDA_VISIBLE_DEVICES" > {seen}
echo 'Loading something'
echo '{remote_probe.DEFAULTS_MARK}{json.dumps(answer)}'
""")
    got = remote_probe.release_defaults([{"python": str(fake), "gpu_mib": 97871, "gpus": "2,3",
                                          "args": ["--model-path", "/models/q", "--tp-size", "2"]}])
    assert got == [answer]
    args_json, offline, visible = seen.read_text().splitlines()
    assert json.loads(args_json) == ["--model-path", "/models/q", "--tp-size", "2"]
    assert (offline, visible) == ("1", "2,3")


def test_a_python_without_sglang_is_an_error_of_that_ask_only(tmp_path: Path) -> None:
    broken = _fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n")
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho 'no marker'\n")
    silent.chmod(0o755)
    got = remote_probe.release_defaults([{"python": str(broken), "gpu_mib": 1, "args": []},
                                         {"python": str(silent), "gpu_mib": 1, "args": []},
                                         {"python": str(tmp_path / "nowhere"), "gpu_mib": 1, "args": []}])
    assert "No module named 'sglang'" in got[0]["error"] and "exit 1" in got[0]["error"]
    assert "exit 0" in got[1]["error"] and "error" in got[2]
    facts = remote_probe.main({"defaults": [{"python": str(broken), "gpu_mib": 1, "args": []}]})
    assert facts["defaults"][0]["error"]


def test_the_probe_reads_a_model_folder_that_lives_only_on_the_host(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The script as it is sent to a host (the readers prepended, no gpudeploy there): config.json and
    the checkpoint's sizes from the safetensors headers, and an error per folder it cannot read."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "memory"))
    import safetensors_files

    folder = tmp_path / "Qwen3-4B-NVFP4"
    folder.mkdir()
    config = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128}
    (folder / "config.json").write_text(json.dumps(config))
    size = safetensors_files.write(folder / "model-00001-of-00001.safetensors",
                                   {"model.layers.0.self_attn.q_proj.weight": ("U8", [64, 32]),
                                    "model.layers.0.self_attn.q_proj.weight_scale": ("F8_E4M3", [64, 4]),
                                    "model.embed_tokens.weight": ("BF16", [128, 64])})
    res = subprocess.run([sys.executable, "-c", probe.SOURCE,
                          json.dumps({"models": [str(folder), str(tmp_path / "nowhere")]})],
                         capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["models"]
    assert got[str(folder)]["config"] == config
    ckpt = got[str(folder)]["checkpoint"]
    assert ckpt["total_bytes"] == size and ckpt["attention_bytes"] == 64 * 32 + 64 * 4
    assert ckpt["by_dtype"] == {"U8": 2048, "F8_E4M3": 256, "BF16": 16384}
    assert "No such file" in got[str(tmp_path / "nowhere")]["error"]
