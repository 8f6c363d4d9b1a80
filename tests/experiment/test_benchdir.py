"""The benchmark client's run folder, made for real by the host-side script (run here, as a host runs
it) under bases another user could have prepared: a planted symlink, a folder of another owner, a
mode that lets others in. And the client's argv: its HOME is that private folder, its python skips
user site-packages."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeploy.errors import RemoteError
from gpudeploy.experiment import bench, benchdir
from gpudeploy.experiment.spec import Benchmark


def make(base: str | Path, prefix: str = "exp.v.c1-r0.") -> dict[str, str]:
    res = subprocess.run(benchdir.make_argv(sys.executable, str(base), prefix), capture_output=True, text=True,
                         timeout=30, check=True)
    doc: dict[str, str] = json.loads(res.stdout)
    return doc


def test_a_run_folder_is_made_private_and_fresh_under_a_base_made_0700(tmp_path: Path) -> None:
    base = tmp_path / "home" / ".cache" / "gpudeploy" / "bench"
    first, second = make(base)["path"], make(base)["path"]
    assert first != second and Path(first).parent == base and Path(first).name.startswith("exp.v.c1-r0.")
    for path in (base, base.parent, base.parent.parent, Path(first)):
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, path


def test_a_planted_symlink_anywhere_on_the_way_is_refused_and_nothing_is_made_behind_it(tmp_path: Path) -> None:
    target = tmp_path / "attacker"
    target.mkdir()
    (tmp_path / "shared").symlink_to(target)
    doc = make(tmp_path / "shared" / "bench")
    assert "error" in doc and f"{tmp_path / 'shared'} is a symbolic link" in doc["error"], doc
    assert list(target.iterdir()) == []
    (tmp_path / "base").symlink_to(target)  # the base itself
    assert "is a symbolic link" in make(tmp_path / "base").get("error", ""), "base symlink accepted"


def test_a_base_of_another_mode_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "bench"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    assert "must belong to" in make(base).get("error", "") and "with mode 0755" in make(base)["error"]
    base.chmod(0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone may rename what is in it (no sticky bit)
    doc = make(open_dir / "bench")
    assert f"{open_dir} is writable by others (mode 0777)" in doc.get("error", ""), doc
    assert not (open_dir / "bench").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_on_the_way_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 12345, 12345)
    doc = make(theirs / "bench")
    assert f"{theirs} belongs to uid 12345, not to root or to the SSH user" in doc.get("error", ""), doc
    assert not (theirs / "bench").exists()


def test_a_refusal_reaches_the_user_as_the_hosts_error() -> None:
    with pytest.raises(RemoteError) as exc:
        benchdir.parse("lab2", "~/.cache/gpudeploy/bench", json.dumps({"error": "/home/u is a symbolic link"}))
    assert str(exc.value) == "lab2: refusing to run the benchmark client: /home/u is a symbolic link"
    with pytest.raises(RemoteError):
        benchdir.parse("lab2", "b", "Traceback (most recent call last):\n", "python3: not found")


def target(client: str, python: str | None) -> bench.Target:
    from gpudeploy.model import Host, SshConfig

    host = Host(name="n1", address="10.0.0.1", ssh=SshConfig(), numa_nodes=(), gpu_memory_gib={},
                engine_versions={}, python="/usr/bin/python3", bind_address="0.0.0.0", numa_policy="none", env={},
                placements=())
    return bench.Target(host, "http://10.0.0.1:8000", "n1/router", "m", "/models/m", client, "sglang", 4, False,
                        python)


@pytest.mark.parametrize(("client", "python"), [("sglang", "/opt/sglang/bin/python"), ("vllm", "/opt/v/bin/python"),
                                                ("vllm", None)])
def test_the_client_runs_without_user_site_packages_in_its_private_folder(client: str, python: str | None) -> None:
    folder = "/root/.cache/gpudeploy/bench/exp.v.c1-r0.k2j3h4"
    argv = bench.client_argv(Benchmark(), target(client, python), 4, folder)
    assert "PYTHONNOUSERSITE=1" in argv and f"HOME={folder}" in argv and f"TMPDIR={folder}" in argv
    if python:
        assert argv[argv.index(python) + 1] == "-s", argv
    assert not any("/var/tmp" in a for a in argv), argv


def test_the_default_base_is_the_ssh_users_own() -> None:
    assert Benchmark().remote_dir == "~/.cache/gpudeploy/bench" == benchdir.DEFAULT_BASE


def test_each_run_gets_its_own_private_folder_from_the_host_and_nothing_under_var_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: `mkdir -p -m 0700 /var/tmp/gpudeploy-bench/<exp>/<variant>/<run>`, then HOME there.
    from fakelab import FakeLab
    from test_experiment_file import write

    from gpudeploy.experiment.runner import run_experiment
    from gpudeploy.experiment.spec import load_experiment

    lab = FakeLab(monkeypatch)
    run_experiment(load_experiment(write(tmp_path, "variants:\n  a: {}\nbenchmark: {concurrency: [1, 2]}\n")),
                   say=lab.say)
    assert not any("/var/tmp" in word or word == "mkdir" for c in lab.commands for word in c), lab.commands
    made = [c for c in lab.commands if c[1:4] == ["-I", "-c", benchdir.MAKE_RUN_DIR]]
    assert [c[0] for c in made] == ["/opt/sglang/.venv/bin/python"] * 2  # the host's python, isolated
    assert [c[-2:] for c in made] == [["~/.cache/gpudeploy/bench", "exp.a.c1-r0."],
                                      ["~/.cache/gpudeploy/bench", "exp.a.c2-r0."]]
    for client, prefix in zip(lab.client_runs(), ("exp.a.c1-r0.", "exp.a.c2-r0."), strict=True):
        folder = f"/root/.cache/gpudeploy/bench/{prefix}q7x2k9"  # what the host's script answered
        assert f"HOME={folder}" in client and client[client.index("/opt/sglang/.venv/bin/python") + 1] == "-s"
        assert ["rm", "-rf", "--", folder] in lab.commands
