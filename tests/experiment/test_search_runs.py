"""`gpudeploy tune` on fakelab, answering through the documented response surface (surface.py): the
search reaches the optimum's region within its budget; what the memory preflight refuses is recorded
and never launched; a launch that dies is recorded with its cause and its region is not launched again;
Ctrl-C (or a crash) mid-trial, then the same command, goes on without repeating a finished trial; the
best variant is written as files `deploy` plans as they are; the deployment stays up between trials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import surface
from fakelab import FakeLab
from test_experiment_file import REPO

from gpudeploy.experiment import record
from gpudeploy.experiment import search as tune
from gpudeploy.experiment.runner import ExperimentStopped
from gpudeploy.experiment.search_space import sample
from gpudeploy.experiment.show import summary, table
from gpudeploy.experiment.spec import load_experiment
from gpudeploy.experiment.store import Store
from gpudeploy.fanout import Interrupted


def run(path: Path, lab: FakeLab) -> tune.Result:
    result = tune.run_search(load_experiment(path), say=lab.say)
    assert result is not None
    return result


def study(path: Path) -> optuna.Study:
    return optuna.load_study(study_name="exp", storage=record.storage_url(record.study_file(load_experiment(path))))


def infos(path: Path) -> list[dict[str, Any]]:
    return [record.info(t) for t in study(path).trials]


@dataclass
class Searched:
    lab: FakeLab
    path: Path
    result: tune.Result


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Searched:
    """One search of the documented surface's whole space, shared by the tests that read it (each
    search costs seconds): seed 8 comes within 5% of the grid's best at its 7th launch, and proposes
    variants the memory preflight refuses (3)."""
    with pytest.MonkeyPatch.context() as mp:  # fakelab's patches end with the search
        lab = surface.answer(FakeLab(mp))
        path = surface.write(tmp_path_factory.mktemp("big"), surface.search_file(launches=10, seed=8))
        return Searched(lab, path, run(path, lab))


def test_the_search_reaches_the_optimums_region_within_its_budget(big: Searched) -> None:
    # The grid holds 180 variants the preflight lets boot (surface.py); the best feasible one scores
    # 584.2 tok/s per GPU (decode m=0.85, b=256, r=256). A third of the grid's launches: 60; given 10
    # (bench/tune.py measures five seeds at a budget of 60).
    best, where = surface.grid_best()
    assert (round(best, 1), where) == (584.2, (0.85, 256, 256))
    lab, path, result = big.lab, big.path, big.result
    launched = surface.launched(lab)
    assert len(launched) == result.tally.launches <= 10
    found = max(surface.score(*p) or 0.0 for p in launched)
    assert found >= 0.95 * best, (found, launched)
    assert result.best[0]["values"]["output_tok_s_per_gpu"] == pytest.approx(found, rel=1e-6)
    # the table is best first, and says so; the plot and the report's figures are there
    doc = summary(Store(load_experiment(path).results_dir))
    assert doc["variants"][0]["name"] == result.best[0]["variant"] == doc["best"]["variant"]
    assert "* best by the search's objective under the SLO: " + result.best[0]["variant"] in table(doc)
    text = "\n".join(result.lines)
    assert f"launches: {result.tally.launches} spent ({result.tally.measured} measured" in text, text
    assert "saved, refused without a launch" in text and "optuna-dashboard sqlite:///" in text, text
    # the deployment stayed up between trials: only what changed restarts (deploy's unchanged units),
    # never rolled through the router; it is torn down once, at the end
    assert {o.rolling for o in lab.deploy_options} == {"never"}
    assert lab.torn_down == 1 and not lab.up


def test_variants_the_memory_preflight_refuses_are_recorded_without_a_launch(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # m below ~0.59 leaves no room for the weights (the real preflight's verdict on this inventory)
    lab = surface.answer(FakeLab(monkeypatch))
    path = surface.write(tmp_path, surface.search_file(launches=10, seed=3).replace(
        "range: [0.5, 0.95], step: 0.025", "range: [0.5, 0.575], step: 0.025").replace(
        "[32, 64, 128, 256]", "[64]").replace("[64, 128, 256]", "[128]"))
    result = run(path, lab)
    assert result.stopped == "every point of the space (4) has been tried"
    assert lab.plans == [] and lab.client_runs() == []
    assert result.tally.launches == 0 and result.tally.refused_preflight >= 1
    store = Store(load_experiment(path).results_dir)
    rows = store.current()
    assert rows and all(r["status"] == "skipped" and "memory preflight predicts" in r["verdict"] for r in rows)
    # the sampler was told: a constraint it reads, not a silent gap
    told = [t for t in study(path).trials if record.info(t).get("outcome") == "refused-preflight"]
    assert told and all(t.constraints["refused_by_memory_preflight"] == 1.0 for t in told)
    assert "no trial met the SLO yet" in "\n".join(result.lines)


def test_in_the_whole_space_no_variant_the_memory_preflight_refuses_is_launched(big: Searched) -> None:
    # the sampler proposed some of the refused region (m below 0.6) and none of it was launched
    assert big.result.tally.refused_preflight >= 1, big.lab.out
    assert all(m >= surface.BOOTS_FROM for m, _, _ in surface.launched(big.lab))


def oom_at_or_above(m0: float, b0: int) -> Any:
    def on_deploy(plan: Any) -> Any:
        m, b, _ = surface.decode(plan)
        return surface.oom(plan) if m >= m0 and b >= b0 else None
    return on_deploy


def test_a_launch_that_dies_is_recorded_with_its_cause_and_its_region_is_not_launched_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The inventory's own decode (m 0.70, b 64, r 128) is the first trial; here it OOMs in graph capture,
    # and so does everything with m >= 0.7 and b >= 64: the region the rule rules out.
    lab = surface.answer(FakeLab(monkeypatch))
    lab.on_deploy = oom_at_or_above(0.7, 64)
    path = surface.write(tmp_path, """\
search:
  space:
    decode.settings.mem_fraction_static: {choices: [0.65, 0.7, 0.75, 0.8]}
    decode.settings.cuda_graph_max_bs: {choices: [64, 128]}
    decode.settings.max_running_requests: {choices: [128]}
  objective: output_tok_s_per_gpu
  budget: {launches: 8, trials: 16}
  seed: 5
""" + surface.BENCH)
    result = run(path, lab)
    launched = surface.launched(lab)
    assert launched[0] == (0.7, 64, 128)  # the baseline
    assert [p for p in launched if p[0] >= 0.7] == [(0.7, 64, 128)], launched  # its region: never again
    assert len(launched) == len(set(launched))
    assert result.tally.failed == {"oom-in-graph-capture": 1} and result.tally.refused_learned >= 1
    first = infos(path)[0]
    assert first["outcome"] == "deploy-failed" and first["cause"] == "oom-in-graph-capture"
    assert first["region"]["worse"] == {"decode.settings.mem_fraction_static": 1,
                                        "decode.settings.cuda_graph_max_bs": 1,
                                        "decode.settings.max_running_requests": 1}
    store = Store(load_experiment(path).results_dir)
    row = next(r for r in store.current() if r["key"] == first["key"])
    assert row["status"] == "deploy-failed" and "CUDA out of memory" in row["failure"], row
    skipped = [r for r in store.current() if r["status"] == "skipped"]
    assert skipped and all(r["verdict"].startswith("inside the region trial 0's launch showed fails "
                                                   "(oom-in-graph-capture at decode.mem_fraction_static=0.7")
                           for r in skipped), skipped
    assert "not launched again" in lab.out or "SKIPPED, inside the region trial 0" in lab.out
    trial0 = study(path).trials[0]
    assert trial0.constraints["launch_failed"] == 1.0  # the sampler is told, not left to try again
    # the study keeps the region: the same command again (more launches) still does not go there
    path.write_text(path.read_text().replace("launches: 8, trials: 16", "launches: 8, trials: 24"))
    lab.plans.clear()
    run(path, lab)
    assert all(p[0] < 0.7 for p in surface.launched(lab)), surface.launched(lab)


def interrupt_at_client_run(lab: FakeLab, number: int) -> None:
    """Ctrl-C while the number-th benchmark client runs (fanout's Interrupted, as status() raises it)."""
    count = [0]

    def on_command(argv: list[str]) -> None:
        if argv[0] == "timeout":
            count[0] += 1
            if count[0] == number:
                lab.status_error = Interrupted({})

    lab.on_command = on_command


def test_ctrl_c_mid_trial_then_the_same_command_goes_on_and_repeats_no_finished_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = surface.answer(FakeLab(monkeypatch))
    interrupt_at_client_run(lab, 8)  # trial 0 and 1 measure 3 to 5 levels each; this is within a later trial
    path = surface.write(tmp_path, surface.search_file(launches=5, seed=4))
    with pytest.raises(Interrupted):
        run(path, lab)
    first = list(lab.plans)
    cut = len(first) - 1  # the trial that was interrupted is the last launch
    trials = study(path).trials
    states = [(t.state, record.info(t).get("outcome")) for t in trials]
    # the interrupted trial is failed in the study, and its point queued to run first
    assert states[-2:] == [(optuna.trial.TrialState.FAIL, "interrupted"), (optuna.trial.TrialState.WAITING, None)]
    assert "queued again" in record.info(trials[-2])["reason"]
    assert trials[-1].system_attrs["fixed_params"] == trials[-2].params
    assert "`invoke tune --file " in lab.out and "goes on from here" in lab.out
    store = Store(load_experiment(path).results_dir)
    interrupted = {r["key"]: r for r in store.variants()}[record.info(trials[-2])["key"]]
    levels_before = {r.concurrency: r.started for r in store.runs(interrupted["key"]) if r.ok}
    assert interrupted["status"] == "interrupted" and levels_before
    clients_before = len(lab.client_runs())

    lab.status_error = None
    lab.on_command = lambda argv: None
    lab.said.clear()
    result = run(path, lab)
    again = surface.launched(lab)[len(first):]
    # the interrupted trial's point runs first; no point measured before is launched again
    assert again[0] == surface.decode(first[cut])
    assert not set(again[1:]) & {surface.decode(p) for p in first}, (first, again)
    # its levels measured before the Ctrl-C are kept as they were (not measured again); the rest added
    after = {r.concurrency: r.started for r in store.runs(interrupted["key"]) if r.ok}
    assert {c: t for c, t in after.items() if c in levels_before} == levels_before and len(after) > len(levels_before)
    assert len(lab.client_runs()) - clients_before >= 1
    retry = study(path).trials[len(states) - 1]
    assert retry.user_attrs.get("retry_of") == len(states) - 2 and record.info(retry)["outcome"] == "measured"
    assert result.tally.interrupted == 1 and result.tally.launches == 5
    assert "going on with the study" in lab.out


def test_a_trial_left_running_by_a_crash_is_failed_and_retried_first(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lab = surface.answer(FakeLab(monkeypatch))
    path = surface.write(tmp_path, surface.search_file(launches=3, seed=6))
    run(path, lab)
    # a kill -9 mid-trial: the study holds a RUNNING trial with its point, nobody told it anything
    s = study(path)
    s.enqueue_trial({"decode.settings.mem_fraction_static": 0.8, "decode.settings.cuda_graph_max_bs": 128,
                     "decode.settings.max_running_requests": 64})
    crashed = s.ask()
    sample(crashed, load_experiment(path).search)  # type: ignore[arg-type]
    path.write_text(path.read_text().replace("launches: 3", "launches: 4"))
    lab.said.clear()
    run(path, lab)
    trials = study(path).trials
    assert trials[crashed.number].state == optuna.trial.TrialState.FAIL
    assert "a crash or a kill" in record.info(trials[crashed.number])["reason"]
    assert f"trial {crashed.number} was running when the last tune stopped" in lab.out
    assert surface.launched(lab)[-1] == (0.8, 128, 64)


def test_the_best_variant_is_written_as_files_deploy_plans_as_they_are(big: Searched) -> None:
    lab, result = big.lab, big.result
    inventory, decode_file = result.written
    assert decode_file.name == "decode.yml" and decode_file.parent == inventory.parent / "roles"
    best = result.best[0]["params"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "plan", "--inventory",
                          str(inventory), "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr  # 0: deploy would go ahead as it is
    units = {u["role"]: u["argv"] for u in json.loads(res.stdout)["units"]}
    decode = units["decode"]
    assert decode[decode.index("--mem-fraction-static") + 1] == f"{best['decode.settings.mem_fraction_static']:g}"
    assert decode[decode.index("--cuda-graph-max-bs-decode") + 1] == str(best["decode.settings.cuda_graph_max_bs"])
    assert decode[decode.index("--max-running-requests") + 1] == str(best["decode.settings.max_running_requests"])
    assert units["prefill"] == list(next(u.argv for u in lab.plans[0].units if u.role.name == "prefill"))  # as it was
    assert f"`gpudeploy deploy --inventory {inventory}` deploys it as it is" in "\n".join(result.lines)


def test_several_objectives_give_a_pareto_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = surface.answer(FakeLab(monkeypatch))
    path = surface.write(tmp_path, surface.search_file(launches=4, seed=8).replace(
        "objective: output_tok_s_per_gpu", "objective: [output_tok_s_per_gpu, {p99_tpot_ms: {concurrency: 64}}]"))
    result = run(path, lab)
    front = result.best
    assert front and "Pareto front" in "\n".join(result.lines)
    measured = [record.info(t) for t in study(path).trials if record.info(t).get("outcome") == "measured"]
    assert {(f["variant"]) for f in front} <= {m["variant"] for m in measured}
    for f in front:  # nothing measured beats a front member on both
        tok, tpot = f["values"]["output_tok_s_per_gpu"], f["values"]["p99_tpot_ms@c64"]
        assert not any(t.values[0] > tok and t.values[1] < tpot for t in study(path).trials
                       if record.info(t).get("outcome") == "measured" and all(v <= 0 for v in t.constraints.values()))


def test_a_second_tune_of_the_same_study_is_refused_while_one_runs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    lab = surface.answer(FakeLab(monkeypatch))
    path = surface.write(tmp_path, surface.search_file(launches=1, seed=9))
    folder = Path(load_experiment(path).results_dir)
    with record.lock(folder), pytest.raises(Exception) as exc:
        run(path, lab)
    assert "another tune of this study runs now (pid " in str(exc.value)
    assert lab.plans == []
    assert not isinstance(exc.value, ExperimentStopped)
