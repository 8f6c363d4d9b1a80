"""Lab stand-in for the ``sglang-router`` package: ``python3 -m sglang_router.launch_router``."""

__version__ = "0.3.2"
