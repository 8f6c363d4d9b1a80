"""What `pip install <this repo>` installs: the package with its role library, templates and the
captured --help of each release, the `gpudeploy` console script, and not the lab.

The role library and the templates are kept once, at the top of the repository (roles/, templates/);
src/gpudeploy/roles and src/gpudeploy/templates are links to them, which setuptools reads through as
package data, so the wheel holds real files and a checkout (or an editable install) reads the same ones."""

from __future__ import annotations

import configparser
import json
import os
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
    shutil.copytree(REPO, source, ignore=NOT_SOURCE, symlinks=True)  # links stay links, as in a clone
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                          "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"pip wheel failed: {res.stderr[-2000:]}")
    (built,) = out.glob("gpudeploy-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_ships_roles_templates_and_data_but_not_the_lab(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    roles = {n.rsplit("/", 1)[1] for n in names if n.startswith("gpudeploy/roles/")}
    assert roles == {p.name for p in (REPO / "roles").glob("*.yml")}
    assert {"prefill.yml", "decode.yml", "router.yml", "vllm.yml", "command.yml"} <= roles
    templates = {n.rsplit("/", 1)[1] for n in names if n.startswith("gpudeploy/templates/")}
    assert templates == {p.name for p in (REPO / "templates").glob("*.j2")}
    assert {"engine.service.j2", "engine.env.j2"} <= templates
    assert "gpudeploy/data/sglang-0.5.23-launch_server-help.txt" in names
    assert "gpudeploy/cli/tasks.py" in names and "gpudeploy/init/write.py" in names
    assert not [n for n in names if n.startswith(("gpudeploy_lab/", "lab/", "tests/", "roles/", "templates/"))]
    for name in (n for n in names if n.startswith(("gpudeploy/roles/", "gpudeploy/templates/"))):
        assert wheel.read(name) == (REPO / name.removeprefix("gpudeploy/")).read_bytes()


def test_the_checkout_keeps_one_copy_of_the_roles_and_templates() -> None:
    # the package's folders are the top-level ones (a second copy would drift from what is tested)
    for folder in ("roles", "templates"):
        assert (REPO / "src" / "gpudeploy" / folder).resolve() == (REPO / folder).resolve()


def test_the_wheel_plans_with_its_own_roles_and_templates(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """The wheel's gpudeploy, unpacked as pip would install it, in a folder of the user's own holding
    only an example inventory: its roles and unit templates come from the wheel."""
    site = tmp_path / "site-packages"
    wheel.extractall(site)
    home = tmp_path / "mine"
    (home / "inventory").mkdir(parents=True)
    shutil.copyfile(REPO / "inventory" / "one-node.yml", home / "inventory" / "hosts.yml")
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    env.update(PYTHONPATH=str(site), GPUDEPLOY_CALIBRATION=str(tmp_path / "calibration.json"))

    def gd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "import sys; from gpudeploy.cli import main; sys.exit(main())",
                               *args], cwd=home, capture_output=True, text=True, timeout=120, env=env)

    roles = gd("roles", "--json")
    assert roles.returncode == 0, roles.stderr
    listed = {r["name"]: r for r in json.loads(roles.stdout)}
    assert set(listed) == {"prefill", "decode", "router", "vllm", "command"}
    assert all(r["source"] == "packaged" and r["file"].startswith(str(site)) for r in listed.values()), listed
    plan = gd("plan", "--json")
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr
    units = {u["role"]: u for u in json.loads(plan.stdout)["units"]}
    assert set(units) == {"prefill", "decode", "router"}
    unit_file = units["decode"]["files"]["/etc/systemd/system/gpudeploy-pd.decode.service"]
    assert unit_file.startswith("# gpudeploy-pd.decode.service: rendered by gpudeploy from role decode")
    assert "NUMAPolicy=bind" in unit_file and "--disaggregation-mode decode" in unit_file


def test_the_wheel_installs_the_gpudeploy_command(wheel: zipfile.ZipFile) -> None:
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    points = configparser.ConfigParser()
    points.read_string(wheel.read(entry).decode())
    assert dict(points["console_scripts"]) == {"gpudeploy": "gpudeploy.cli:main"}
