"""Small stdlib scripts that run on a host (passed as ``python3 -c``). No imports of ours here."""

# Runs on the host: SIGKILL one PID, but only if its start time (in clock ticks since boot) is the
# recorded one, so a PID reused since is never hit. argv: PID START_TICKS|None
KILL_EXACT = """
import os, signal, sys
pid, want = int(sys.argv[1]), sys.argv[2]
try:
    stat = open(f"/proc/{pid}/stat").read()
except OSError:
    sys.exit(0)
ticks = stat[stat.rindex(")") + 2:].split()[19]
if want in ("", "None") or ticks == want:
    os.kill(pid, signal.SIGKILL)
"""
