"""Flags read off a real ``--help``: what argparse shows there is what the captured table says."""

from __future__ import annotations

from gpudeploy.flagspec import DATA, load_flags, parse_help

# Lines of the real SGLang 0.5.23 --help (COLUMNS=200, as the host probe runs it).
REAL = """options:
  -h, --help            show this help message and exit
  --model-checksum [MODEL_CHECKSUM]
                        Model file integrity verification.
  --lora-target-modules [{q_proj,k_proj,all} ...]
  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE
                        The tensor parallelism size.
  --enable-metrics      Enable log prometheus metrics.
"""


def test_an_optional_value_and_a_short_alias_are_read() -> None:
    flags = parse_help(REAL)
    assert flags["--model-checksum"].nargs == "?" and flags["--model-checksum"].takes_value
    assert flags["-h"].nargs == 0 and flags["--help"].nargs == 0
    assert flags["--lora-target-modules"].nargs == "*"
    assert flags["--tensor-parallel-size"].takes_value and flags["--tp-size"].nargs is None
    assert flags["--enable-metrics"].nargs == 0 and not flags["--enable-metrics"].takes_value


def test_the_real_help_agrees_with_the_captured_table_on_every_option_it_shows() -> None:
    # What a --help cannot tell: options argparse hides (help=SUPPRESS) and choices a metavar
    # replaces; choice order is not kept either (SGLang builds some lists from sets).
    learned = parse_help((DATA / "sglang-0.5.23-launch_server-help.txt").read_text())
    captured = load_flags("sglang", "0.5.23")
    assert set(captured) - set(learned) == {"--forward-pass-metrics-ipc-name", "--forward-pass-metrics-worker-id"}
    assert set(learned) <= set(captured)
    differ = {k for k, v in learned.items()
              if (v.takes_value, v.nargs, frozenset(v.choices or ())) !=
              (captured[k].takes_value, captured[k].nargs, frozenset(captured[k].choices or ()))}
    assert differ == {"--lora-target-modules"}  # its metavar is its own choice list, not argparse's
