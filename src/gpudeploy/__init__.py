"""gpudeploy: inventory -> plan -> apply -> verify for LLM inference servers on GPU nodes.

This top-level module stays import-light on purpose: the lab's stand-in engine
(``gpudeploy_lab.standin``, a package beside this one) runs on lab hosts with nothing but Debian's
python3 and uses ``gpudeploy.flagspec``, so nothing here may import fabric or jinja2. Nothing in
``gpudeploy`` imports the lab.
"""

__version__ = "0.1.0"
