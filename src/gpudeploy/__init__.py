"""gpudeploy: inventory -> plan -> apply -> verify for LLM inference servers on GPU nodes.

This top-level module stays import-light on purpose: the stand-in engine (``gpudeploy.standin``)
runs on lab hosts with nothing but Debian's python3, so nothing here may import fabric or jinja2.
"""

__version__ = "0.1.0"
