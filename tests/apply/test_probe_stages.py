"""Deploy's probe in two stages (apply/probe_stages.py): what the first reads, what waits, and how
the two are put together."""

from __future__ import annotations

from gpudeploy.apply import probe_stages


def test_what_guards_a_start_waits_for_the_second_stage_and_the_units_are_read_again() -> None:
    spec = {"units": ["u"], "files": ["/etc/u"], "http": {"u": "http://x"}, "reach": [{"address": "a"}],
            "ports": True, "gpus": True, "versions": {"/usr/bin/python3": ["sglang"]}}
    first = probe_stages.staged(spec)
    assert {k for k in first if k != "later"} == {"units", "files", "http", "reach"}
    assert first["later"] == {"units": ["u"], "ports": True, "gpus": True,
                              "versions": {"/usr/bin/python3": ["sglang"]}}
    assert probe_stages.second_spec(spec) == first["later"]
    assert "later" not in probe_stages.staged({"units": ["u"], "files": []})  # nothing to wait for


def test_the_first_stages_empty_answers_never_pass_for_none_there() -> None:
    answered = {"units": {"u": {"old": True}}, "files": {}, "listening": {}, "gpus": None, "versions": {},
                "topology": None, "process_units": {"p": 1}}
    first = probe_stages.first_facts(answered)
    assert not probe_stages.complete(first) and "gpus" not in first and "listening" not in first
    more = {"units": {"u": {"old": False}}, "process_units": {"p": 2}, "listening": {"30000": [7]},
            "gpus": {"devices": []}, "versions": {}, "topology": None, "files": {"ignored": "x"}}
    both = probe_stages.merged(first, more)
    assert probe_stages.complete(both)
    # the units as the second stage found them, beside its GPUs and ports; the first stage's files
    assert both["units"] == {"u": {"old": False}} and both["process_units"] == {"p": 2}
    assert both["listening"] == {"30000": [7]} and both["files"] == {}
