"""Which SGLang release the stand-in is on a host, and whose flags it takes (stdlib only).

A lab host can pretend to run a release gpudeploy has never captured: the file
``/etc/gpudeploy-lab/sglang.json`` (``GPUDEPLOY_LAB_SGLANG`` names another path) holds
``{"version": "0.5.99", "flags_like": "0.5.10"}``. Then ``import sglang; sglang.__version__`` is
``"0.5.99"``, while ``python3 -m sglang.launch_server`` takes exactly the flags of the captured 0.5.10
and prints 0.5.10's captured ``--help`` verbatim (a renamed flag, e.g. 0.5.10's ``--cuda-graph-max-bs``
against 0.5.23's ``--cuda-graph-max-bs-decode``, is refused in the other spelling, as the real parser
does). ``flags_like`` left out means the release's own capture.

``SGLANG_STANDIN_VERSION`` in the environment wins over the file: it is then both the version and
the flags (``SGLANG_STANDIN_FLAGS_LIKE`` overrides the flags in either case). Without file and
environment the stand-in is 0.5.23.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_VERSION = "0.5.23"
DEFAULT_RELEASE_FILE = "/etc/gpudeploy-lab/sglang.json"


def release_file() -> Path:
    return Path(os.environ.get("GPUDEPLOY_LAB_SGLANG") or DEFAULT_RELEASE_FILE)


def read_release_file(path: Path | None = None) -> tuple[str, str] | None:
    """(version, flags_like) from the file, None when there is none; ValueError when it is malformed
    (a lab fixture that wrote nonsense should fail loudly, not fall back to the default)."""
    path = path or release_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    data = json.loads(text)
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not version.strip():
        raise ValueError(f"{path}: wants {{\"version\": \"X.Y.Z\", \"flags_like\": \"X.Y.Z\"}}, got {text.strip()!r}")
    flags_like = data.get("flags_like") or version
    if not isinstance(flags_like, str):
        raise ValueError(f"{path}: flags_like must be a release string, got {flags_like!r}")
    return version.strip(), flags_like.strip()


def sglang_release() -> tuple[str, str]:
    """(the version the stand-in reports, the captured release whose flags and --help it uses)."""
    env_version = (os.environ.get("SGLANG_STANDIN_VERSION") or "").strip()
    env_flags = (os.environ.get("SGLANG_STANDIN_FLAGS_LIKE") or "").strip()
    if env_version:
        return env_version, env_flags or env_version
    found = read_release_file()
    version, flags_like = found if found else (DEFAULT_VERSION, DEFAULT_VERSION)
    return version, env_flags or flags_like


def release_json(version: str, flags_like: str | None = None) -> str:
    """The file's text, as :func:`gpudeploy_lab.control.set_sglang_release` writes it."""
    return json.dumps({"version": version, "flags_like": flags_like or version}) + "\n"
