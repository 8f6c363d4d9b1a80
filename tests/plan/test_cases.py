"""Plan cases as data: each file under cases/ is an inventory + roles + what the plan must say.

A case's ``expect.units`` lists, per unit, fields that must match the plan's JSON exactly, plus
``argv_has`` (sub-sequences of argv), ``argv_lacks`` (flags that must be absent) and ``file_has``
(substrings of the rendered unit). ``expect.problems`` lists substrings that must each appear in the
error output, with ``problem_count`` for the exact number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.errors import InputError
from gpudeploy.plan import load_plan
from gpudeploy.report import plan_json

REPO = Path(__file__).resolve().parents[2]
CASES = sorted((Path(__file__).parent / "cases").glob("*.yml"))


def materialize(case: dict[str, Any], root: Path) -> Path:
    (root / "inventory").mkdir()
    roles_dir = root / "roles"
    roles_dir.mkdir()
    for path in (REPO / "lab" / "roles").glob("*.yml"):  # the lab's roles; the packaged ones are found as they are
        (roles_dir / path.name).write_text(path.read_text())
    for name, role in (case.get("roles") or {}).items():
        text = role if isinstance(role, str) else yaml.safe_dump(role, sort_keys=False)
        (roles_dir / f"{name}.yml").write_text(text)
    if case.get("templates"):  # a case's own templates override the packaged ones file by file
        templates = root / "templates"
        templates.mkdir()
        for name, text in case["templates"].items():
            (templates / name).write_text(text)
    inv = root / "inventory" / "hosts.yml"
    if "inventory_text" in case:
        inv.write_text(case["inventory_text"])
    else:
        inv.write_text(yaml.safe_dump(case["inventory"], sort_keys=False))
    return inv


def has_subsequence(argv: list[str], words: list[str]) -> bool:
    n = len(words)
    return any(argv[i:i + n] == words for i in range(len(argv) - n + 1))


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_case(case_file: Path, tmp_path: Path) -> None:
    case = yaml.safe_load(case_file.read_text())
    inv = materialize(case, tmp_path)
    expect = case["expect"]
    select = case.get("select") or {}
    if "problems" in expect:
        with pytest.raises(InputError) as err:
            load_plan(str(inv), **select)
        text = str(err.value)
        for needle in expect["problems"]:
            assert needle in text, f"{needle!r} not in:\n{text}"
        if "problem_count" in expect:
            assert len(err.value.problems) == expect["problem_count"], text
        return
    doc = plan_json(load_plan(str(inv), **select))
    units = {(u["host"], u["role"]): u for u in doc["units"]}
    if "unit_count" in expect:
        assert len(units) == expect["unit_count"]
    for want in expect.get("units", []):
        got = units[(want["host"], want["role"])]
        for key, value in want.items():
            if key == "argv_has":
                for words in value:
                    seq = words if isinstance(words, list) else words.split(" ")
                    assert has_subsequence(got["argv"], seq), (words, got["argv"])
            elif key == "argv_lacks":
                for flag in value:
                    assert flag not in got["argv"], (flag, got["argv"])
            elif key == "file_has":
                unit_text = got["files"][next(p for p in got["files"] if p.endswith(".service"))]
                for needle in value:
                    assert needle in unit_text, (needle, unit_text)
            elif key == "memory_verdict":
                assert got["memory"]["verdict"] == value, got["memory"]
            elif key == "memory_flags_have":
                for flag in value:
                    assert flag in got["memory"]["recommended_flags"], got["memory"]
            elif key == "env_file_has":
                env_text = got["files"][next(p for p in got["files"] if p.endswith(".env"))]
                for needle in value:
                    assert needle in env_text, (needle, env_text)
            else:
                assert got[key] == value, (key, got[key], value)
