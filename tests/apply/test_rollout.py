"""Rolling batches of deployments, as Ansible's serial cuts them, and the failure budget."""

from __future__ import annotations

import pytest

from gpudeploy.apply.rollout import batches, over_budget, parse_serial
from gpudeploy.errors import InputError
from gpudeploy.fanout import default_forks

NAMES = [f"pd{i:02d}" for i in range(64)]


def test_a_canary_then_quarters_then_the_rest() -> None:
    got = batches(NAMES, parse_serial("1,25%,100%"))
    assert [len(b) for b in got] == [1, 16, 47]
    assert [n for b in got for n in b] == NAMES  # every deployment once, in order


def test_the_last_step_repeats_until_all_had_their_turn() -> None:
    assert [len(b) for b in batches(NAMES, parse_serial("1,25%"))] == [1, 16, 16, 16, 15]
    assert [len(b) for b in batches(NAMES[:3], parse_serial("2"))] == [2, 1]
    assert batches(NAMES[:3], None) == [NAMES[:3]]


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "150%", "1,,2", "0%"])
def test_a_bad_serial_is_a_clear_error(bad: str) -> None:
    with pytest.raises(InputError, match="--serial"):
        parse_serial(bad)


def test_the_failure_budget() -> None:
    assert over_budget(1, 1, 0.0) and not over_budget(0, 17, 0.0)
    assert not over_budget(2, 17, 20.0) and over_budget(4, 17, 20.0)


def test_fan_out_is_bounded_like_pyinfra() -> None:
    assert default_forks(64, nofile=1024) == min(64, (1024 - 10) // 3, 20 * (__import__("os").cpu_count() or 1))
    assert default_forks(64, nofile=40) == 10  # open files decide: (40 - 10) / 3
    assert default_forks(1, nofile=1 << 20) == 1
