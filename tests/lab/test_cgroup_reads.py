"""The lab's cgroup readers survive cgroups that vanish while they read them.

systemd inside a lab host removes cgroups at any moment (a session scope that just ended). Reading
``cgroup.procs`` of a removed cgroup gives ENODEV, not ENOENT; that once crashed ``lab.up`` in CI.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gpudeploy_lab import system


def _tree(root: Path) -> tuple[Path, Path]:
    kept = root / "system.slice" / "sshd.service"
    gone = root / "user.slice" / "session-1.scope"
    for d, pids in ((root, ""), (kept, "101\n102\n"), (gone, "201\n")):
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text(pids)
        (d / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    return kept, gone


def test_cgroup_removed_mid_walk_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _kept, gone = _tree(tmp_path)
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self.parent == gone:
            raise OSError(errno.ENODEV, "No such device", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert sorted(system.cgroup_pids(tmp_path)) == [101, 102]
    assert system.cgroup_populated(gone) is False
    assert system.cgroup_populated(tmp_path) is True
