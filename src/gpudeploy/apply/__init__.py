"""apply."""
