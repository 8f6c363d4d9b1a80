"""What `pip install <this repo>` installs: the package with its role library, templates and the
captured --help of each release, the `gpudeploy` console script, and not the lab."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# What a checkout holds that is no source: a build from it must not see them (setuptools' build/ keeps
# files a later build would ship although the source no longer has them).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".bench-venv", "build", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".mypy_cache", ".ruff_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "gpudeploy"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                          "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"pip wheel failed: {res.stderr[-2000:]}")
    (built,) = out.glob("gpudeploy-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_ships_roles_templates_and_data_but_not_the_lab(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    roles = {n.rsplit("/", 1)[1] for n in names if n.startswith("gpudeploy/roles/")}
    assert roles == {p.name for p in (REPO / "src/gpudeploy/roles").glob("*.yml")}
    assert {"prefill.yml", "decode.yml", "router.yml", "vllm.yml", "command.yml"} <= roles
    assert {"gpudeploy/templates/engine.service.j2", "gpudeploy/templates/engine.env.j2"} <= names
    assert "gpudeploy/data/sglang-0.5.23-launch_server-help.txt" in names
    assert "gpudeploy/cli/tasks.py" in names and "gpudeploy/init/write.py" in names
    assert not [n for n in names if n.startswith(("gpudeploy_lab/", "lab/", "tests/", "roles/", "templates/"))]
    for name in (n for n in names if n.startswith("gpudeploy/roles/")):
        assert wheel.read(name) == (REPO / "src" / name).read_bytes()


def test_the_wheel_installs_the_gpudeploy_command(wheel: zipfile.ZipFile) -> None:
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    points = configparser.ConfigParser()
    points.read_string(wheel.read(entry).decode())
    assert dict(points["console_scripts"]) == {"gpudeploy": "gpudeploy.cli:main"}
