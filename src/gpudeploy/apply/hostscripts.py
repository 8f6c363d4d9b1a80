"""Small stdlib scripts that run on a host (passed as ``python3 -c``). No imports of ours here."""

# Runs on the host: SIGKILL each PID whose start time (clock ticks since boot, /proc/PID/stat
# field 22) is the recorded one, so a PID reused since is never hit. A PID without a start time
# is refused, never killed. argv: PID:START_TICKS ...  Prints one line per PID:
# "killed PID", "gone PID", "spared PID (started at T, not W)" or "refused PID (no start time)".
KILL_EXACT = """
import os, signal, sys
for arg in sys.argv[1:]:
    pid, _, want = arg.partition(":")
    if not want.isdigit():
        print("refused", pid, "(no start time)")
        continue
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except OSError:
        print("gone", pid)
        continue
    ticks = stat[stat.rindex(")") + 2:].split()[19]
    if ticks != want:
        print("spared", pid, f"(started at {ticks}, not {want})")
        continue
    try:
        os.kill(int(pid), signal.SIGKILL)
        print("killed", pid)
    except ProcessLookupError:
        print("gone", pid)
"""


def kill_exact_argv(python: str, targets: list[tuple[int, int | None]]) -> list[str]:
    """``python``: the host's interpreter (the inventory's ``python``), never PATH's guess."""
    return [python, "-c", KILL_EXACT, *(f"{pid}:{'' if ticks is None else ticks}" for pid, ticks in targets)]
