"""Templates in, file texts out. Jinja2 with StrictUndefined; all decisions are made in Python.

Values are escaped here, not in the templates, so a template never needs logic to be safe. Role
files are data: their argv templates (and the unit templates) render in Jinja's immutable sandbox,
so ``{{ cycler.__init__.__globals__.os.popen(...) }}`` is a SecurityError, not a shell.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from ..controlchars import CONTROL as _CONTROL
from ..controlchars import control_problem
from ..errors import Problem
from ..library import template_dirs

_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")

__all__ = ["Renderer", "control_problem", "env_value", "exec_line", "systemd_word", "unit_text"]

def _c_escape(text: str) -> str:
    # systemd unquotes ExecStart words with C escapes; a control character can only travel as \xNN.
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def systemd_word(arg: str) -> str:
    """Quote one argv element for ExecStart= (systemd's own rules, not a shell's).

    ``%`` starts a specifier and ``$`` a variable expansion in ExecStart=, so both are doubled;
    backslash and quote are escaped inside double quotes; control characters (refused earlier by
    the plan) would be written as C escapes, never raw.
    """
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if arg and _SAFE.fullmatch(arg):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{_c_escape(escaped)}"'


def unit_text(value: str) -> str:
    """A free-text value for a unit file setting such as Description=: ``%`` is a specifier there."""
    return _c_escape(value.replace("%", "%%"))


def exec_line(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(systemd_word(a) for a in argv)


def env_value(value: str) -> str:
    """Quote a value for an EnvironmentFile= line.

    systemd reads a double-quoted value like a POSIX shell double-quoted string: backslash keeps
    the next ``"``, ``\\``, `` ` `` or ``$``, and the value may span lines (a multi-line secret
    stays one value). Nothing else in the value is special there.
    """
    if value and _SAFE.fullmatch(value):
        return value
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


class Renderer:
    def __init__(self, templates_dir: str | Path | None) -> None:
        """``templates_dir``: the inventory's own templates, searched before the packaged ones
        (library.template_dirs); None or "": the packaged ones only."""
        self.dirs = template_dirs(templates_dir)
        self.dir = self.dirs[0]
        # Not HTML: autoescaping would corrupt unit files. Values are escaped in Python instead.
        self.env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            loader=jinja2.FileSystemLoader([str(d) for d in self.dirs]),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,
        )

    def render(self, name: str, context: Mapping[str, Any], problems: list[Problem],
               **where: Any) -> str | None:
        """Render ``name``; a missing template or variable becomes a Problem naming file and line."""
        try:
            template = self.env.get_template(name)
        except jinja2.TemplateNotFound:
            problems.append(Problem(f"template not found in {' nor '.join(str(d) for d in self.dirs)}",
                                    file=str(self.dir / name), **where))
            return None
        except jinja2.TemplateSyntaxError as exc:
            problems.append(Problem(f"template syntax error: {exc.message}", file=exc.filename or name,
                                    line=exc.lineno, **where))
            return None
        file = template.filename or str(self.dir / name)
        try:
            return template.render(**context)
        except jinja2.TemplateSyntaxError as exc:
            problems.append(Problem(f"template syntax error: {exc.message}", file=exc.filename or name,
                                    line=exc.lineno, **where))
        except jinja2.UndefinedError as exc:
            problems.append(Problem(f"template variable is not defined: {exc.message}",
                                    file=file, line=_template_line(exc, name), **where))
        except jinja2.TemplateError as exc:  # e.g. SecurityError: the sandbox refused an attribute
            problems.append(Problem(f"template error: {exc}", file=file, line=_template_line(exc, name), **where))
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
