"""The host probe: one round trip that returns every fact (the script is ``remote_probe.py``).

It runs with the host's python over any transport that can ``run`` a command, so status can use
the shared OpenSSH connection and deploy the paramiko one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from ..errors import RemoteError
from ..model import Host
from ..remote.base import Result

# One script: the probe, with the process supervisor's host module in front of it as PROCESS_HOST,
# the GPU health reader as GPU_HEALTH and the safetensors header reader as CHECKPOINT (a host has no
# gpudeploy to import them from). All are read as files, not imported: status starts the probe before
# it has imported the supervisors and the planner (verify/head_start.py).
_PACKAGE = Path(__file__).resolve().parents[1]
_FUTURE = "from __future__ import annotations\n"


def _module(name: str, path: Path) -> str:
    # registered in sys.modules before it runs: a dataclass resolves its string annotations through
    # its module's entry there (the checkpoint reader's would fail without one)
    key = f"gpudeploy_probe_{name}"
    return (f"{name.upper()} = sys.modules[{key!r}] = types.ModuleType({key!r})\n"
            f"exec(compile({path.read_text()!r}, {name!r}, 'exec'), {name.upper()}.__dict__)\n")


GPU_HEALTH_SOURCE = (_PACKAGE / "facts" / "gpu_health.py").read_text()
_PRELUDE = ("import sys\nimport types\n" + _module("process_host", _PACKAGE / "supervisor" / "process_host.py")
            + _module("gpu_health", _PACKAGE / "facts" / "gpu_health.py")
            + _module("checkpoint", _PACKAGE / "memory" / "checkpoint.py"))
SOURCE = (_PACKAGE / "facts" / "remote_probe.py").read_text().replace(_FUTURE, _FUTURE + _PRELUDE, 1)


class Runner(Protocol):
    host: Host

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result: ...


def probe(runner: Runner, spec: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    host = runner.host
    return parse(host, runner.run(argv(host, json.dumps(spec)), timeout=timeout))


def argv(host: Host, spec: str = "-") -> list[str]:
    """The probe's command line on ``host``; with ``spec`` "-" it reads its spec from stdin."""
    return [host.python or "python3", "-c", SOURCE, spec]


def parse(host: Host, res: Result) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(res.stdout)
    except ValueError:
        raise RemoteError(host.name, f"host probe returned no JSON: {res.stdout[:200]!r}") from None
    return data
