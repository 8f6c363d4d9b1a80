"""Lab stand-in for the ``sglang`` package: only ``python3 -m sglang.launch_server`` exists.

The engine itself lives in ``gpudeploy_lab.standin`` (``src`` must be on PYTHONPATH too).
"""

import os

__version__ = os.environ.get("SGLANG_STANDIN_VERSION") or "0.5.23"
