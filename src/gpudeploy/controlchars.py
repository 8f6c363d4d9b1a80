"""Control characters: refused in user values before they reach a unit or env file line
(:func:`control_problem`); removed from a host's text before it reaches the terminal (:func:`printable`)."""

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


# -- a host's text on our terminal (issue 43, item 13) ---------------------------------------------
#
# A server's log line, an error a host wrote, a process's command line: printed as they came, their
# escape sequences would drive the user's terminal (set its title, write a hyperlink that shows one
# address and opens another, clear the screen, move the cursor over gpudeploy's own lines, ring the
# bell, or a DCS that some terminals answer by typing into the shell). ECMA-48's forms, 7- and 8-bit:
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"  # CSI: parameters, intermediates, final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|\Z)"  # OSC DCS SOS PM APC to their end
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?",  # any other escape (ESC c resets the terminal), or a lone ESC
    re.DOTALL)
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` from a host, safe to print: escape sequences and control characters removed.

    Removed: CSI (colours, cursor moves, clear screen), OSC (titles, OSC 8 hyperlinks: their text
    stays), DCS/SOS/PM/APC strings, two-byte escapes, the 8-bit C1 forms of all of them, and every
    other control character but tab (a BEL, a backspace). A string with no terminator is removed to
    the end of its line, as a terminal swallows it. A carriage return keeps what a terminal shows of
    a line redrawn with it (tqdm's bars): the text after the last one, so a line can never write
    over gpudeploy's own prefix of it. A newline ends the line: with ``lines`` each line is made
    printable and the newlines kept; else (one line, shown after a prefix) it becomes a space.
    """
    if lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    out = []
    for line in text.rstrip("\r\n").split("\n"):
        line = _SEQUENCE.sub("", line).rstrip("\r")
        out.append(_UNPRINTABLE.sub("", line.rsplit("\r", 1)[-1]))
    return " ".join(out)
