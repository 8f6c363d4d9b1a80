"""Engine release strings, compared the way Python packaging compares them (PEP 440, ``packaging``).

A release as a host reports it (``importlib.metadata.version``, else ``module.__version__``) or as an
inventory declares it can carry a local part (``0.5.23+cu128``: a build of 0.5.23 made elsewhere),
a post or pre release, or be no PEP 440 version at all (``0.5.24-cu128``, a module's own
``__version__``). So:

  * two strings are the same release when packaging reads both and finds them equal (``0.5.23`` =
    ``0.5.23.0`` = ``v0.5.23``; ``0.5.23+cu128`` != ``0.5.23``: a local build may differ), else when
    they are the same string (case and surrounding space aside);
  * the numeric release (``(0, 5, 24)``) is packaging's ``release``, else the leading dotted digits,
    so ``0.5.9-cu128`` is a 0.5.9 and never a 0.5.9128.

``flagspec`` imports this lazily (the lab's stand-in imports ``flagspec`` on hosts with only
Debian's python3, which has no ``packaging``).
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

_LEADING = re.compile(r"v?(\d+(?:\.\d+)*)")


def parse(version: str) -> Version | None:
    """packaging's reading of ``version``, or None when it is not a PEP 440 version."""
    try:
        return Version(version.strip())
    except InvalidVersion:
        return None


def same_release(a: str, b: str) -> bool:
    pa, pb = parse(a), parse(b)
    if pa is not None and pb is not None:
        return pa == pb
    return a.strip().lower() == b.strip().lower()


def release_tuple(version: str) -> tuple[int, ...]:
    """The numeric release: ``0.5.23+cu128`` -> (0, 5, 23); ``0.5.24-cu128`` -> (0, 5, 24)."""
    parsed = parse(version)
    if parsed is not None:
        return parsed.release
    m = _LEADING.match(version.strip().lower())
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def sort_key(version: str) -> tuple[tuple[int, ...], int, Version | str]:
    """Orders releases oldest first: by the numeric release, then PEP 440 order (0.5.24rc1 before
    0.5.24 before 0.5.24+cu128); a string packaging cannot read comes after those of its release."""
    parsed = parse(version)
    if parsed is not None:
        return (parsed.release, 0, parsed)
    return (release_tuple(version), 1, version)
