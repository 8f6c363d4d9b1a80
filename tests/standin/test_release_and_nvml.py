"""A stand-in release gpudeploy has not captured (sglang.json), and a host without NVML (the fake's errors)."""

from __future__ import annotations

import json
import subprocess

from standin_support import PYTHON, REPO, Lab, http_get

from gpudeploy_lab.standin.release import release_json

HELP_0510 = (REPO / "src/gpudeploy/data/sglang-0.5.10-launch_server-help.txt").read_text()
HELP_0523 = (REPO / "src/gpudeploy/data/sglang-0.5.23-launch_server-help.txt").read_text()


def py(lab: Lab, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", code], env=lab.env(**env), cwd=REPO, capture_output=True, text=True,
                          timeout=30)


def launch(lab: Lab, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "sglang.launch_server", *args], env=lab.env(**env), cwd=REPO,
                          capture_output=True, text=True, timeout=30)


VERSION = "import sglang; print(sglang.__version__)"


def test_release_file_sets_the_version_and_the_flags_of_a_captured_release(lab: Lab) -> None:
    assert py(lab, VERSION).stdout == "0.5.23\n"  # no file: the default
    lab.sglang_json.write_text(release_json("0.5.99", "0.5.10"))
    assert json.loads(lab.sglang_json.read_text()) == {"version": "0.5.99", "flags_like": "0.5.10"}
    assert py(lab, VERSION).stdout == "0.5.99\n"
    r = launch(lab, "--help")
    assert r.returncode == 0 and r.stdout == HELP_0510  # byte for byte, as deploy would read it
    # 0.5.10's spelling is taken, 0.5.23's refused as argparse refuses an unknown option
    r = launch(lab, "--model-path", "m", "--cuda-graph-max-bs-decode", "8")
    assert r.returncode == 2 and "unrecognized arguments: --cuda-graph-max-bs-decode 8" in r.stderr
    p, port = lab.engine("--cuda-graph-max-bs", "16")
    assert "(bs=16 " in p.wait_line("Capturing batches")
    p.wait_line("The server is fired up and ready to roll!")
    got = http_get(port, "/server_info")
    assert got is not None and json.loads(got[1])["version"] == "0.5.99"


def test_environment_wins_over_the_file_and_a_missing_flags_like_means_its_own(lab: Lab) -> None:
    lab.sglang_json.write_text(release_json("0.5.99", "0.5.10"))
    assert py(lab, VERSION, SGLANG_STANDIN_VERSION="0.5.23").stdout == "0.5.23\n"
    assert launch(lab, "--help", SGLANG_STANDIN_VERSION="0.5.23").stdout == HELP_0523
    lab.sglang_json.write_text(json.dumps({"version": "0.5.10"}))
    assert py(lab, VERSION).stdout == "0.5.10\n"
    assert launch(lab, "--help").stdout == HELP_0510
    # an uncaptured release without flags_like cannot run: the stand-in says so (exit 2)
    lab.sglang_json.write_text(json.dumps({"version": "0.5.99"}))
    r = launch(lab, "--help")
    assert r.returncode == 2 and "no captured flags for sglang 0.5.99" in r.stderr
    lab.sglang_json.write_text("{not json")
    assert py(lab, VERSION).returncode != 0  # a broken fixture fails loudly


PROBE = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as e:
    print(type(e).__module__, type(e).__name__, repr(e), str(e), e.value, repr(e.__context__), sep="|")
else:
    print("ok", pynvml.nvmlDeviceGetCount())
"""


def test_nvml_without_the_library_or_without_the_driver_raises_like_nvidia_ml_py(lab: Lab) -> None:
    assert py(lab, PROBE).stdout.strip() == "ok 4"
    hidden = lab.gpus_json.with_name("hidden.json")
    lab.gpus_json.replace(hidden)
    # nvidia-ml-py 13 on a host without libnvidia-ml.so.1: the same class, code, text and context
    assert py(lab, PROBE).stdout.strip().split("|") == [
        "pynvml", "NVMLError_LibraryNotFound", "NVMLError_LibraryNotFound(12)", "NVML Shared Library Not Found",
        "12", "OSError('libnvidia-ml.so.1: cannot open shared object file: No such file or directory')"]
    lab.gpus_json.write_text(json.dumps({"init_error": "DRIVER_NOT_LOADED"}))
    assert py(lab, PROBE).stdout.strip().split("|")[:5] == [
        "pynvml", "NVMLError_DriverNotLoaded", "NVMLError_DriverNotLoaded(9)", "Driver Not Loaded", "9"]
    r = py(lab, "import pynvml; pynvml.nvmlInit()")
    assert r.stderr.rstrip().splitlines()[-1] == "pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded"
    hidden.replace(lab.gpus_json)
    assert py(lab, PROBE).stdout.strip() == "ok 4"


def test_the_fake_has_every_error_class_of_the_real_module(lab: Lab) -> None:
    """Same names and codes as nvidia-ml-py (installed in the dev venv), so except clauses match."""
    import importlib.util

    import pynvml as real
    spec = importlib.util.spec_from_file_location("fake_pynvml_errors", REPO / "lab/shims/pynvml.py")
    assert spec and spec.loader
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    for name in dir(real):
        if name.startswith("NVMLError_"):
            assert getattr(fake, name).__name__ == name
    for code, cls in real.NVMLError._valClassMapping.items():
        mine = fake.NVMLError(code)
        assert type(mine).__name__ == cls.__name__ and mine.value == code
        if code in real.NVMLError._errcode_to_string:
            assert str(mine) == real.NVMLError._errcode_to_string[code]
