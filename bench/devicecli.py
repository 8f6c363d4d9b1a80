"""The device scripts' way of running gpudeploy as a user would: `invoke TASK ... --inventory F`,
each command's output appended to a transcript, its time and exit status kept in the summary."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

Invoke = Callable[..., "subprocess.CompletedProcess[str]"]


def invoker(py: str, env: dict[str, str], work: Path, transcript: Path, summary: dict[str, Any]) -> Invoke:
    """``gd(name, *argv, timeout=300, inventory="hosts.yml")``: run one invoke task of this checkout."""

    def gd(name: str, *argv: str, timeout: float = 300,
           inventory: str = "hosts.yml") -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        res = subprocess.run([py, "-m", "invoke", "--search-root", str(REPO), *argv, "--inventory",
                              str(work / inventory)], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=timeout)
        took = time.monotonic() - t0
        with transcript.open("a") as f:
            f.write(f"\n== {name}\n$ invoke {' '.join(argv)} --inventory {inventory}\n# exit {res.returncode}, "
                    f"{took:.2f} s\n{res.stdout}{res.stderr}")
        print(f"== {name}: exit {res.returncode} in {took:.2f} s\n{res.stdout}{res.stderr}", flush=True)
        summary[f"{name}_s"], summary[f"{name}_rc"] = round(took, 2), res.returncode
        return res

    return gd
