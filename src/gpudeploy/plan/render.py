"""Templates in, file texts out. Jinja2 with StrictUndefined; all decisions are made in Python.

Values are escaped here, not in the templates, so a template never needs logic to be safe.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from ..errors import Problem

_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_word(arg: str) -> str:
    """Quote one argv element for ExecStart= (systemd's own rules, not a shell's).

    ``%`` starts a specifier and ``$`` a variable expansion in ExecStart=, so both are doubled.
    """
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if arg and _SAFE.match(arg):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def exec_line(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(systemd_word(a) for a in argv)


def env_value(value: str) -> str:
    """Quote a value for an EnvironmentFile= line (double quotes, backslash escapes)."""
    if value and re.match(r"^[A-Za-z0-9_@+=:,./-]+$", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Renderer:
    def __init__(self, templates_dir: str | Path) -> None:
        self.dir = Path(templates_dir)
        # Not HTML: autoescaping would corrupt unit files. Values are escaped in Python instead.
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.dir)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,  # noqa: S701
        )

    def render(self, name: str, context: Mapping[str, Any], problems: list[Problem],
               **where: Any) -> str | None:
        """Render ``name``; a missing template or variable becomes a Problem naming file and line."""
        try:
            return self.env.get_template(name).render(**context)
        except jinja2.TemplateNotFound:
            problems.append(Problem(f"template not found in {self.dir}", file=str(self.dir / name), **where))
        except jinja2.TemplateSyntaxError as exc:
            problems.append(Problem(f"template syntax error: {exc.message}", file=exc.filename or name,
                                    line=exc.lineno, **where))
        except jinja2.UndefinedError as exc:
            problems.append(Problem(f"template variable is not defined: {exc.message}",
                                    file=str(self.dir / name), line=_template_line(exc, name), **where))
        return None

    def render_string(self, text: str, context: Mapping[str, Any]) -> str:
        """Render an inline template (a command role's argv element). Raises jinja2 errors."""
        return self.env.from_string(text).render(**context)


def _template_line(exc: BaseException, name: str) -> int | None:
    # Jinja rewrites tracebacks so template frames carry the template's file and line.
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.endswith(name):
            return frame.lineno
    return None
