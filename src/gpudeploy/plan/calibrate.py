"""A small JSON store of what SGLang runs measured, per host + model + settings.

The figures come from :func:`gpudeploy.memory.logparse.parse_memory_log` (re-exported here for
deploy); ``gpudeploy.memory.budget(..., measured=...)`` prefers them over its estimates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..memory.logparse import Measured, parse_memory_log

__all__ = ["CalibrationStore", "Measured", "calibration_key", "parse_memory_log"]


def calibration_key(host: str, model: str, settings: Mapping[str, Any]) -> str:
    """Stable key for host + model + the settings that shape memory."""
    blob = json.dumps({"host": host, "model": model, "settings": dict(settings)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class CalibrationStore:
    """Measured figures per host + model + settings, in one JSON file at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, host: str, model: str, settings: Mapping[str, Any]) -> Measured | None:
        entry = self._load().get(calibration_key(host, model, settings))
        if not isinstance(entry, dict) or not isinstance(entry.get("measured"), dict):
            return None
        return Measured.from_json(entry["measured"])

    def latest(self, host: str, model: str) -> tuple[dict[str, Any], Measured] | None:
        """The newest run of ``model`` on ``host`` under any settings, with those settings.

        After a failure the role's settings change (to the recommendation), and the next plan
        must still know what the failed run measured: one failure is enough.
        """
        best: tuple[int, dict[str, Any], Measured] | None = None
        for entry in self._load().values():
            if (not isinstance(entry, dict) or entry.get("host") != host or entry.get("model") != model
                    or not isinstance(entry.get("measured"), dict) or not isinstance(entry.get("settings"), dict)):
                continue
            seq = entry.get("seq", 0)
            if best is None or (isinstance(seq, int) and seq > best[0]):
                best = (seq if isinstance(seq, int) else 0, entry["settings"], Measured.from_json(entry["measured"]))
        return None if best is None else (best[1], best[2])

    def put(self, host: str, model: str, settings: Mapping[str, Any], measured: Measured) -> None:
        self.put_many([(host, model, settings, measured)])

    def put_many(self, runs: Iterable[tuple[str, str, Mapping[str, Any], Measured]]) -> None:
        """Several runs' figures (host, model, settings, measured), in order, in one read and one
        write of the file: a deploy of 64 hosts keeps 64 (one put each read and rewrote the whole
        file 64 times, 0.3 s after the last server was ready)."""
        runs = list(runs)
        if not runs:
            return
        data = self._load()
        seq = max((e.get("seq", 0) for e in data.values() if isinstance(e, dict)
                   and isinstance(e.get("seq", 0), int)), default=0)
        for host, model, settings, measured in runs:
            seq += 1
            data[calibration_key(host, model, settings)] = {
                "host": host, "model": model, "settings": {k: settings[k] for k in sorted(settings)},
                "measured": measured.to_json(), "seq": seq,
            }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path)
