"""Control characters in user values: refused before they reach a unit or env file line."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but tab


def control_problem(value: str) -> str | None:
    """Why ``value`` cannot go into a unit or env file line, or None.

    A newline in a value would end the line it is on: the rest becomes a directive of its own
    (``ExecStartPre=...``) or a line systemd ignores (a folded YAML ``>`` value pushes the next
    flag there). Such values are refused at plan time, with the key that holds them.
    """
    m = CONTROL.search(value)
    if m is None:
        return None
    names = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}
    what = names.get(m.group(), f"control character {m.group()!r}")
    hint = " (a folded `>` or literal `|` YAML value ends with one; use a plain or quoted string)" \
        if m.group() == "\n" and m.start() == len(value) - 1 else ""
    return f"{value!r} contains {what}{hint}"
