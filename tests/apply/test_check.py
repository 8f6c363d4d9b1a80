"""deploy --check diffs of env files never show a value that is not a planned public one."""

from __future__ import annotations

from pathlib import Path

from gpudeploy.apply.check import file_diff
from gpudeploy.plan import load_plan
from gpudeploy.plan.envfile import assignments

REPO = Path(__file__).resolve().parents[2]

OLD_ENV = (
    "# Environment of a unit\n"
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300\n"
    "OLD_TOKEN=hf_renamed_away_secret\n"               # a secret the role no longer has
    'CERT="-----BEGIN-----\nline-two-secret\n-----END-----"\n'  # a multi-line value
    "HAND_EDIT='single\nquoted-secret'\n"
    "CONT=first\\\ncontinued-secret\n"
)


def test_env_diff_masks_every_value_whose_key_is_not_public() -> None:
    fleet = str(REPO / "lab" / "inventory" / "hosts.yml")
    unit = load_plan(fleet, host="node171", role="prefill", memory=False).units[0]
    diff = file_diff(unit, unit.env_path, OLD_ENV)
    assert "-secret" not in diff and "quoted-secret" not in diff and "_secret" not in diff, diff
    assert "-OLD_TOKEN=********" in diff and "-CERT=********" in diff and "-CONT=********" in diff
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300" in diff  # public values still show


def test_env_file_pieces_join_back_to_the_file() -> None:
    pieces = assignments(OLD_ENV)
    assert "".join(raw for _, raw in pieces) == OLD_ENV
    assert [k for k, _ in pieces] == [None, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "OLD_TOKEN", "CERT",
                                      "HAND_EDIT", "CONT"]
