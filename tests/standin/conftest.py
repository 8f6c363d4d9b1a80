"""Fixtures for the stand-in tests; the helpers live in standin_support.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_support import Lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()
