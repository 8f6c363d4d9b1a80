"""A new user's mistakes as data: each folder under mistakes/ is a project as the user wrote it, and
``plan`` must refuse it with the lines that say what is wrong, where, and how to fix it.

A case folder holds the inventory (``inventory/hosts.yml``, else ``hosts.yml``; ``inventory.txt``
names what the user gave ``--inventory`` instead), its ``roles/`` and any other files, and
``expected.txt``: blocks separated by blank lines, each an excerpt of the output (one line, or
consecutive lines such as a YAML error's source line and caret); a block that starts with ``! ``
must not appear; ``#`` lines are comments. The output is read as the user sees it, from the case's
folder: paths relative to it, ``@CASE@`` for the folder itself (also replaced in the case's files, for
a model folder readable here) and ``<packaged roles>`` for the packaged role library.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from gpudeploy.cli.args import inventory_path
from gpudeploy.errors import GpudeployError
from gpudeploy.library import PACKAGED_ROLES
from gpudeploy.plan import load_plan
from gpudeploy.report import plan_text

MISTAKES = Path(__file__).parent / "mistakes"
CASES = sorted(p for p in MISTAKES.iterdir() if (p / "expected.txt").is_file())


def plan_as_the_cli_does(given: str) -> tuple[int, str]:
    """``gpudeploy plan --inventory GIVEN``: the CLI's own inventory lookup and planner, its message on
    an error (user_errors), without the calibration store of this machine."""
    try:
        plan = load_plan(inventory_path(given), offline_flags=True)
    except Exit as exc:
        return int(exc.code or 0), str(exc.message)
    except GpudeployError as exc:
        return 1, f"gpudeploy: {exc}"
    return 0, plan_text(plan, show_files=False)


def blocks(expected: str) -> list[str]:
    lines = [line for line in expected.splitlines() if not line.startswith("#")]
    return [b.strip("\n") for b in "\n".join(lines).split("\n\n") if b.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_mistake(case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "project"  # its ../roles (the default roles_dir of hosts.yml here) does not exist
    shutil.copytree(case, root)
    for path in root.rglob("*"):
        if path.is_file() and "@CASE@" in path.read_text():
            path.write_text(path.read_text().replace("@CASE@", str(root)))
    given = (root / "inventory.txt").read_text().strip() if (root / "inventory.txt").is_file() else \
        "inventory/hosts.yml" if (root / "inventory" / "hosts.yml").is_file() else "hosts.yml"
    monkeypatch.chdir(root)
    code, output = plan_as_the_cli_does(given)
    output = output.replace(str(root), "@CASE@").replace(str(PACKAGED_ROLES), "<packaged roles>")
    assert code != 0, output
    assert "Traceback" not in output
    for block in blocks((case / "expected.txt").read_text()):
        if block.startswith("! "):
            assert block[2:] not in output, f"{block[2:]!r} is in:\n{output}"
        else:
            assert block in output, f"{block!r} not in:\n{output}"
