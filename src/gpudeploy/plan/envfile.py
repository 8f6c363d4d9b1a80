"""Reading an EnvironmentFile= back, for diffs: which text belongs to which variable.

systemd's syntax (systemd.exec(5)): ``KEY=value`` lines; ``#``/``;`` lines are comments; a
single-quoted value may span lines verbatim; a double-quoted one may span lines with backslash
escapes; an unquoted one ends at the line's end unless that ends in a backslash. A diff of such a
file must show no value that is not a planned public one, however the file spells it.
"""

from __future__ import annotations

from .build import SECRET_MASK


def assignments(text: str) -> list[tuple[str | None, str]]:
    """Split ``text`` into (key, raw text) pieces in order; key None for comments/blank lines.

    Every character of ``text`` is in exactly one piece, so joining the raw texts gives it back.
    """
    out: list[tuple[str | None, str]] = []
    i, n = 0, len(text)
    while i < n:
        end = text.find("\n", i)
        end = n if end < 0 else end + 1
        line = text[i:end]
        stripped = line.lstrip()
        if not stripped.strip() or stripped[0] in "#;" or "=" not in line:
            out.append((None, line))
            i = end
            continue
        key = line.split("=", 1)[0].strip()
        j = i + line.index("=") + 1
        while j < n and text[j] in " \t":
            j += 1
        if j < n and text[j] in "'\"":
            quote = text[j]
            j += 1
            while j < n and text[j] != quote:
                j += 2 if quote == '"' and text[j] == "\\" else 1
            j = min(n, j + 1)
            nl = text.find("\n", j)
            j = n if nl < 0 else nl + 1
        else:
            while j < n and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1  # a backslash-newline continues the value
            j = min(n, j + 1)
        out.append((key, text[i:j]))
        i = j
    return out


def mask(text: str, public: set[str]) -> str:
    """The file with every value whose key is not in ``public`` replaced by the mask."""
    pieces = []
    for key, raw in assignments(text):
        if key is None or key in public:
            pieces.append(raw)
        else:
            pieces.append(f"{key}={SECRET_MASK}\n")
    return "".join(pieces)
