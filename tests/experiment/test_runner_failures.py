"""When the benchmark breaks off (the SSH connection to the router's host drops), that variant fails
with its cause, its deployment is torn down and the experiment goes on; when the teardown cannot be
done either, it stops and says what may still run. Ctrl-C while the units are watched is never taken
for a host that did not answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakelab import FakeLab
from test_experiment_file import write

from gpudeploy.errors import HostUnreachable
from gpudeploy.experiment import runner
from gpudeploy.experiment.runner import ExperimentStopped, run_experiment
from gpudeploy.experiment.spec import key_of, load_experiment
from gpudeploy.experiment.store import Store
from gpudeploy.experiment.variants import plan_variants
from gpudeploy.fanout import Interrupted

VARIANTS = """\
variants:
  a: {}
  b: {decode: {settings: {max_running_requests: 64}}}
benchmark: {concurrency: [1, 2], prompts: 8}
"""


def blip_at(lab: FakeLab, connect_number: int) -> None:
    """The connect_number-th connection to the router's host fails, as ssh does when the link drops."""
    count = [0]

    def on_connect() -> None:
        count[0] += 1
        if count[0] == connect_number:
            raise HostUnreachable("node171", "ssh connection lost: Connection reset by peer")

    lab.on_connect = on_connect


def statuses(store: Store) -> dict[str, str]:
    return {v["name"]: v["status"] for v in store.current()}


def test_a_dropped_connection_fails_the_variant_tears_it_down_and_goes_on(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the HostUnreachable left run_experiment (a traceback-free exit 1 at best), variant a stayed
    # "running", its deployment up, and b never ran.
    lab = FakeLab(monkeypatch)
    blip_at(lab, 2)  # a's second level
    path = write(tmp_path, VARIANTS)
    store = run_experiment(load_experiment(path), say=lab.say)
    assert statuses(store) == {"a": "bench-failed", "b": "measured"}
    exp = load_experiment(path)
    a = store.variant(key_of(exp, exp.variants[0])) or {}
    assert "the benchmark broke off: node171: ssh connection lost: Connection reset by peer" in a["failure"]
    assert lab.torn_down == 2 and not lab.up
    assert "== a: BENCHMARK FAILED: node171: ssh connection lost" in lab.out, lab.out
    assert "pd is torn down; going on with the next variant" in lab.out
    assert [r.concurrency for r in store.runs(a["key"]) if r.ok] == [1]  # the level it finished is kept
    # --resume runs a again, only the level it lacked; b is finished
    runs_before = len(lab.client_runs())
    lab.said.clear()
    run_experiment(load_experiment(path), resume=True, say=lab.say)
    assert statuses(store) == {"a": "measured", "b": "measured"}
    assert len(lab.client_runs()) == runs_before + 1 and "--max-concurrency 2" in " ".join(lab.client_runs()[-1])
    assert "== b: already measured; not re-run (--resume)" in lab.out


def test_a_drop_that_also_prevents_the_teardown_stops_and_says_what_may_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = FakeLab(monkeypatch)
    blip_at(lab, 2)
    lab.teardown_error = HostUnreachable("node171", "no route to host")
    path = write(tmp_path, VARIANTS)
    monkeypatch.setattr(runner, "status", lambda plan, hosts: {h.name: HostUnreachable(h.name, "no route to host")
                                                               for h in hosts})
    with pytest.raises(ExperimentStopped) as exc:
        run_experiment(load_experiment(path), say=lab.say)
    text = str(exc.value)
    assert "stopped after variant a: the teardown of deployment pd did not finish (node171: no route to host)" \
        in text, text
    assert "not known on node171 (it did not answer; its units of pd may still run)" in text
    assert "invoke teardown --inventory" in text and "--deployment pd" in text and "--resume" in text
    assert len(lab.deployed) == 1  # b was not deployed over a state nobody knows
    assert statuses(Store(load_experiment(path).results_dir)) == {"a": "bench-failed"}


def test_ctrl_c_while_the_units_are_watched_is_an_interruption_not_a_quiet_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fanout.for_each_host raises Interrupted (a GpudeployError) on Ctrl-C; _dead_unit caught every
    # GpudeployError around status() as "the host did not answer this once" and the experiment went on.
    lab = FakeLab(monkeypatch)
    path = write(tmp_path, VARIANTS)
    [p, _] = plan_variants(load_experiment(path))
    lab.status_error = Interrupted({})
    with pytest.raises(Interrupted):
        runner._dead_unit(p.plan)
    with pytest.raises(Interrupted):  # nor while saying what still runs (after a failed teardown)
        runner._still_running(p)
    lab.status_error = None

    def interrupt_during_the_client(argv: list[str]) -> None:
        if argv[0] == "timeout":
            lab.status_error = Interrupted({})

    lab.on_command = interrupt_during_the_client
    with pytest.raises(Interrupted):
        run_experiment(load_experiment(path), say=lab.say)
    store = Store(load_experiment(path).results_dir)
    assert statuses(store) == {"a": "interrupted"}, statuses(store)
    assert len(lab.deployed) == 1 and "interrupted during the benchmark of variant a" in lab.out


def test_a_client_that_gives_no_result_fails_its_variant_with_the_clients_own_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SGLang's bench_serving without `datasets` exited at import: the variant was called "measured",
    # with nothing measured.
    lab = FakeLab(monkeypatch)
    lab.client_error = "    from datasets import load_dataset\nModuleNotFoundError: No module named 'datasets'\n"
    path = write(tmp_path, VARIANTS)
    store = run_experiment(load_experiment(path), say=lab.say)
    assert statuses(store) == {"a": "bench-failed", "b": "bench-failed"}
    exp = load_experiment(path)
    a = store.variant(key_of(exp, exp.variants[0])) or {}
    assert "the benchmark client gave no result" in a["failure"]
    assert "No module named 'datasets'" in a["failure"], a["failure"]
    assert "== a: BENCHMARK FAILED: the client gave no result" in lab.out
