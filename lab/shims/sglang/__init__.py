"""Lab stand-in for the ``sglang`` package: only ``python3 -m sglang.launch_server`` exists.

The engine itself lives in ``gpudeploy_lab.standin`` (``src`` must be on PYTHONPATH too).
``__version__``: ``SGLANG_STANDIN_VERSION`` if set, else the host's /etc/gpudeploy-lab/sglang.json
(``{"version": "0.5.99", "flags_like": "0.5.10"}``, see gpudeploy_lab/standin/release.py), else 0.5.23.
"""

from gpudeploy_lab.standin.release import sglang_release

__version__ = sglang_release()[0]
