"""YAML loading that remembers line numbers, and a checker that collects every problem at once.

Users fix inventories faster when an error says ``hosts.yml:14: host node171, key tp_size: ...``,
so mappings come back as ``LineMap`` (a dict that knows the line of each key).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import Problem

T = TypeVar("T")


class LineMap(dict[str, Any]):
    """A mapping from YAML that knows its own line and the line of each key (1-based)."""

    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A sequence from YAML that knows the line of each item (1-based)."""

    line: int | None = None
    item_lines: list[int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    out = LineMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key: Any = loader.construct_object(key_node, deep=True)
        if not _plain_key(key):
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a plain value, not {_typename(key)}", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _plain_key(key: object) -> bool:
    # YAML allows `? [a, b]: 1`; a list or mapping cannot be a dict key (TypeError, a traceback).
    return isinstance(key, Hashable) and not isinstance(key, (list, dict))


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(path: Path, problems: list[Problem]) -> Any:
    """Parse ``path``; on failure record a Problem with file and line and return None."""
    try:
        text = path.read_text()
    except OSError as exc:
        problems.append(Problem(f"cannot read: {exc.strerror or exc}", file=str(path)))
        return None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problems.append(Problem(syntax_message(_what(exc), text, mark), file=str(path), line=line))
        return None
    except yaml.YAMLError as exc:
        problems.append(Problem(f"YAML error: {exc}", file=str(path)))
        return None


def _what(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's words, with where the construct it was reading began (an unclosed ``{`` is found
    only lines later, where the next key is)."""
    context, begun, mark = exc.context, exc.context_mark, exc.problem_mark
    if context and begun is not None and mark is not None and (begun.line, begun.column) != (mark.line, mark.column):
        at = f"column {begun.column + 1}" if begun.line == mark.line else \
            f"line {begun.line + 1}, column {begun.column + 1}"
        context = f"{context} that began at {at}:"
    return " ".join(p for p in (context, exc.problem) if p)


def syntax_message(what: str, text: str, mark: Any) -> str:
    """PyYAML's words, with the column, the line itself and a caret under the spot, and a plain
    hint for the mistakes its words do not explain (a tab, a line indented off its block)."""
    if mark is None:
        return f"YAML syntax error: {what}"
    lines = text.splitlines()
    source = lines[mark.line] if mark.line < len(lines) else ""
    # Tabs are shown as the spaces they look like, so the caret stays under the spot.
    shown = source.expandtabs(8).rstrip()
    start = len(source[:mark.column].expandtabs(8))
    width = len(source[:mark.column + 1].expandtabs(8)) - start  # a tab's caret spans the tab
    caret = " " * start + "^" * max(1, width)
    out = f"YAML syntax error: {what} (column {mark.column + 1})\n      {shown}\n      {caret}"
    hint = _syntax_hint(what, source)
    return out + (f"\n    hint: {hint}" if hint else "")


def _syntax_hint(what: str, source: str) -> str | None:
    if "'\\t'" in what or "\t" in source[:len(source) - len(source.lstrip())]:
        return "tabs are not allowed for indentation in YAML; indent with spaces"
    if "expected <block end>" in what:
        return ("this line is indented differently from the keys above it: keys of one mapping start in "
                "the same column, and a nested mapping goes further right")
    if "mapping values are not allowed here" in what:
        return "a value holds ': ' (quote it), or a nested mapping does not start on a line of its own"
    return None


class Checker:
    """Typed access to one YAML mapping that records problems instead of raising."""

    def __init__(self, data: Any, problems: list[Problem], file: str, *,
                 host: str | None = None, role: str | None = None, prefix: str = "",
                 line: int | None = None) -> None:
        self.problems = problems
        self.file = file
        self.host = host
        self.role = role
        self.prefix = prefix
        if isinstance(data, dict):
            self.data: dict[str, Any] = data
        else:
            self.data = {}
            if data is not None:
                self.fail(f"expected a mapping, got {_typename(data)}", None, line=_line(data))
        # A missing key is reported at the line that names this mapping (e.g. the host's name).
        self.line = line or getattr(data, "line", None)

    def where(self, key: str | None) -> int | None:
        if key is not None and isinstance(self.data, LineMap):
            return self.data.line_of(key)
        return self.line

    def fail(self, message: str, key: str | None, line: int | None = None) -> None:
        full_key = (self.prefix + key) if key else (self.prefix.rstrip(".") or None)
        self.problems.append(Problem(message, file=self.file, line=line or self.where(key),
                                     host=self.host, role=self.role, key=full_key))

    def child(self, key: str, *, required: bool = False) -> Checker:
        value = self.get(key, dict, required=required, default=None)
        return Checker(value, self.problems, self.file, host=self.host, role=self.role,
                       prefix=f"{self.prefix}{key}.")

    def unknown_keys(self, allowed: set[str], hints: dict[str, str] | None = None) -> None:
        """Every key not in ``allowed`` is a problem, with the allowed key it most looks like; ``hints``
        says more for keys a user is known to write (``node`` for a NUMA node's ``id``)."""
        for key in self.data:
            if key not in allowed:
                hint = (hints or {}).get(str(key)) or did_you_mean(str(key), allowed)
                self.fail(f"unknown key (allowed: {', '.join(sorted(allowed))})" + (f"; {hint}" if hint else ""),
                          str(key))

    def get(self, key: str, kind: type[T] | tuple[type, ...], *, required: bool = False,
            default: Any = None, check: Callable[[Any], str | None] | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                self.fail("required key is missing", key, line=self.line)
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML ints are acceptable where floats are asked for; bools are never numbers.
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _FLOAT_MAX:        # float() of it would be an OverflowError
                self.fail(f"expected a number, got an integer of {len(str(abs(value)))} digits", key)
                return default
            value = float(value)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            names = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            self.fail(f"expected {names}, got {_typename(value)} {value!r}", key)
            return default
        if check is not None:
            msg = check(value)
            if msg:
                self.fail(msg, key)
                return default
        return value


_FLOAT_MAX = sys.float_info.max


def did_you_mean(word: str, known: Iterable[str]) -> str | None:
    """``did you mean 'address'?`` for the known word closest to a misspelt one (None: none is close)."""
    words = sorted(known)
    # a word cut short (``numa`` for ``numa_node``) is as likely as a typo
    close = difflib.get_close_matches(word, words, n=1, cutoff=0.75) or \
        [k for k in words if len(word) >= 3 and k.startswith(word)][:1]
    return f"did you mean {close[0]!r}?" if close else None


_KIND_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "an integer",
               float: "a number", bool: "true/false"}


def _typename(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    return type(value).__name__


def _line(value: Any) -> int | None:
    return getattr(value, "line", None)
