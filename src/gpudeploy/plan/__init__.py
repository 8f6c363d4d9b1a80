"""Pure planning: inventory + roles -> units. Imports nothing that touches the network."""

from .build import build_plan, load_plan, unit_name

__all__ = ["build_plan", "load_plan", "unit_name"]
