"""--resume knows a variant by its overrides and the benchmark settings, not by its name: an edited
variant runs again (and says why), a grid point keeps its runs when the grid-N names shift, and a
store written before keys existed is read as it is and kept."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from fakelab import FakeLab
from test_experiment_file import REPO, write

from gpudeploy.experiment.runner import run_experiment
from gpudeploy.experiment.show import summary, table
from gpudeploy.experiment.spec import key_of, load_experiment
from gpudeploy.experiment.store import Store

BENCH = "benchmark: {concurrency: [1, 2], prompts: 8}\n"


def run(path: Path, lab: FakeLab, resume: bool = False) -> Store:
    return run_experiment(load_experiment(path), resume=resume, say=lab.say)


def test_an_edited_variant_runs_again_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = FakeLab(monkeypatch)
    path = write(tmp_path, "variants:\n  base: {}\n  more: {decode: {settings: {max_running_requests: 256}}}\n"
                 + BENCH)
    run(path, lab)
    assert len(lab.deployed) == 2 and len(lab.client_runs()) == 4
    path.write_text(path.read_text().replace("256", "200"))
    lab.said.clear()
    store = run(path, lab, resume=True)
    # Before: "more" was matched by name, "already measured", and its 256 runs stood for 200.
    assert "== base: already measured; not re-run (--resume)" in lab.out, lab.out
    assert ("== more: the stored more was measured with other overrides or benchmark settings than the file gives "
            "it now (overrides were {\"decode\": {\"settings\": {\"max_running_requests\": 256}}}); its 2 runs are "
            "not reused: it runs again") in lab.out, lab.out
    assert len(lab.deployed) == 3 and "--max-running-requests 200" in lab.deployed[2]
    assert len(lab.client_runs()) == 6
    doc = summary(store)
    more = next(v for v in doc["variants"] if v["name"] == "more")
    assert more["overrides"]["decode"]["settings"]["max_running_requests"] == 200 and len(more["levels"]) == 2
    assert [v["name"] for v in doc["variants"]] == ["base", "more"]
    assert "not shown: stored variants whose definition the experiment file no longer has: more (its earlier " \
           "definition)" in table(doc)


def test_benchmark_settings_are_part_of_a_variant_but_its_time_limit_is_not(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lab = FakeLab(monkeypatch)
    path = write(tmp_path, "variants:\n  base: {}\n" + BENCH)
    run(path, lab)
    path.write_text(path.read_text().replace("prompts: 8}", "prompts: 8, timeout_s: 900}"))
    run(path, lab, resume=True)
    assert len(lab.deployed) == 1, "a longer time limit measured nothing new"
    path.write_text(path.read_text().replace("prompts: 8", "prompts: 16"))
    run(path, lab, resume=True)
    assert len(lab.deployed) == 2 and "--num-prompts 16" in " ".join(lab.client_runs()[-1])
    assert "benchmark settings changed" in lab.out


def test_grid_points_keep_their_runs_when_a_variant_shifts_their_names(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Values with a space give grid-N names; a named variant added later shifts them by one. Before:
    # grid-2 ("a b" now) was "already measured" with the runs of "c d", and "c d" (grid-3) ran again.
    lab = FakeLab(monkeypatch)
    grid = "grid:\n  prefill.settings.served_model_name: [\"a b\", \"c d\"]\n"
    path = write(tmp_path, grid + BENCH)
    run(path, lab)
    assert len(lab.deployed) == 2
    path.write_text(path.read_text().replace("grid:\n", "variants:\n  base: {}\ngrid:\n"))
    lab.said.clear()
    store = run(path, lab, resume=True)
    assert len(lab.deployed) == 3 and "a b" not in lab.deployed[2] and "c d" not in lab.deployed[2]  # base only
    assert "== grid-2: already measured (as grid-1: the same overrides and benchmark); not re-run" in lab.out
    assert "== grid-3: already measured (as grid-2: the same overrides and benchmark); not re-run" in lab.out
    doc = summary(store)
    assert [v["name"] for v in doc["variants"]] == ["base", "grid-2", "grid-3"]
    for name, model in (("grid-2", "a b"), ("grid-3", "c d")):
        v = next(x for x in doc["variants"] if x["name"] == name)
        assert v["overrides"]["prefill"]["settings"]["served_model_name"] == model
        for lv in v["levels"]:
            argv = lv["client_argv"]
            assert argv[argv.index("--model") + 1] == model, (name, argv)  # its own runs
    assert doc["stale"] == []


def test_a_store_of_the_first_layout_is_read_without_a_write_and_kept_by_the_next_run(tmp_path: Path) -> None:
    # The committed lab-vllm results (variants keyed by name): show must not change the file; the keys
    # computed from its rows are the experiment file's, so --resume re-runs none of them.
    folder = tmp_path / "lab-vllm"
    shutil.copytree(REPO / "bench" / "results" / "lab-vllm", folder)
    before = (folder / "experiment.sqlite").read_bytes()
    store = Store(folder)
    doc = summary(store)
    assert (folder / "experiment.sqlite").read_bytes() == before
    assert doc["best"]["variant"] == "seqs-8" and doc["best"]["concurrency"] == 8
    exp = load_experiment(REPO / "experiments" / "lab-vllm.yml")
    assert store.finished() == {key_of(exp, v) for v in exp.variants}
    runs = {(r.variant, r.concurrency, r.raw_file) for r in store.runs()}
    store.set_meta(name="lab-vllm")  # the first write moves it to the keyed layout
    assert sqlite3.connect(folder / "experiment.sqlite").execute("PRAGMA user_version").fetchone() == (2,)
    assert store.finished() == {key_of(exp, v) for v in exp.variants}
    assert {(r.variant, r.concurrency, r.raw_file) for r in store.runs()} == runs
    assert summary(store)["best"] == doc["best"]


def test_two_variants_that_override_the_same_are_refused(tmp_path: Path) -> None:
    from gpudeploy.errors import InputError

    with pytest.raises(InputError) as exc:
        load_experiment(write(tmp_path, "variants:\n  a: {decode: {settings: {x: 1}}}\n"
                              "  b: {decode: {settings: {x: 1}}}\n" + BENCH))
    assert "variant 'b' overrides exactly what 'a' (line 4) does" in str(exc.value)
