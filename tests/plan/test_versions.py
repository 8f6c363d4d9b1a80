"""Release strings as hosts and inventories write them, compared by PEP 440 (packaging), as data."""

from __future__ import annotations

import pytest

from gpudeploy.facts.check import version_problems
from gpudeploy.memory.releases import release_rules
from gpudeploy.model import Host, SshConfig

# (inventory's release, host's release, the same release?)
SAME = [
    ("0.5.23", "0.5.23", True),
    ("0.5.23", "0.5.23.0", True),          # PEP 440: trailing zeros
    ("0.5.23", "v0.5.23", True),
    ("0.5.23+cu128", "0.5.23+CU128", True),
    ("0.5.23+cu128", "0.5.23", False),     # a local build may differ from the release
    ("0.5.24-cu128", "0.5.24-cu128", True),  # not PEP 440: compared as written
    ("0.5.24-cu128", "0.5.24", False),
    ("0.5.24.post1", "0.5.24-1", True),
    ("0.5.24rc1", "0.5.24", False),
]

# release -> the checked release whose memory rules it gets (memory/releases.py)
RULES = [("0.5.9-cu128", "0.5.9"), ("0.5.10+cu128", "0.5.10"), ("0.5.22.post3", "0.5.10"),
         ("0.5.23+cu130", "0.5.23"), ("0.4.9", "0.4.9"), ("0.4.10rc1", "0.4.10"), ("v0.5.23", "0.5.23")]


@pytest.mark.parametrize(("planned", "found", "same"), SAME)
def test_preflight_compares_releases_as_packaging_does(planned: str, found: str, same: bool) -> None:
    host = Host(name="n1", address="10.0.0.1", ssh=SshConfig(), numa_nodes=(), gpu_memory_gib={},
                engine_versions={}, python="/py", bind_address="0.0.0.0", numa_policy="none", env={}, placements=())
    problems = version_problems(host, [("decode", "/py", "sglang", planned)], {"/py": {"sglang": found}})
    assert (problems == []) == same, problems


@pytest.mark.parametrize(("release", "rules"), RULES)
def test_memory_rules_read_the_numeric_release(release: str, rules: str) -> None:
    # 0.5.9-cu128 was read as 0.5.9128 (digits of each dotted part run together): 0.5.23's rules.
    got = release_rules(release)
    assert (got.checked_as or got.name) == rules
