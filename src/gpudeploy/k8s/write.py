"""Manifests -> YAML text (dicts dumped, never text-templated) and the files of ``--out``."""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import yaml

from .roleset import Manifest


class _Dumper(yaml.SafeDumper):
    """Block style, keys in the order built (apiVersion, kind, metadata, spec), no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # A value with a newline (TQDM_BAR_FORMAT ends in one) reads best as one double-quoted line.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000,
                     allow_unicode=True)


def comment(lines: list[str]) -> str:
    out = []
    for line in lines:
        wrapped = textwrap.wrap(line, 98, break_long_words=False, break_on_hyphens=False) or [""]
        out += [f"# {wrapped[0]}"] + [f"#   {w}" for w in wrapped[1:]]
    return "\n".join(out) + "\n"


def header(deployment: str, inventory: str, notes: list[str]) -> str:
    return comment([f"Deployment {deployment} of {inventory}, rendered by gpudeploy (invoke render --target k8s).",
                    "Not expressed or not checked here:", *(f"- {n}" for n in notes)])


def stream(deployment: str, inventory: str, manifests: list[Manifest], notes: list[str]) -> str:
    """One deployment as one YAML stream (``kubectl apply -f``), its notes as a comment header."""
    return header(deployment, inventory, notes) + "".join("---\n" + dump(m.doc) for m in manifests)


def notes_text(inventory: str, notes: dict[str, list[str]]) -> str:
    parts = [f"# What the manifests of {inventory} cannot express\n"]
    for dep, lines in notes.items():
        parts.append(f"\n## Deployment {dep} ({dep}.yaml)\n\n")
        parts += [textwrap.fill(n, 100, initial_indent="- ", subsequent_indent="  ", break_long_words=False,
                                break_on_hyphens=False) + "\n" for n in lines]
    return "".join(parts)


def write_files(out: Path, files: dict[str, str]) -> list[Path]:
    """Each file written whole (a temporary file renamed over it): a reader never sees half of one."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out / name
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written


def summary(out: Path, manifests: dict[str, list[Manifest]], notes: dict[str, list[str]]) -> str:
    """What ``--out`` wrote, and the notes, for the terminal."""
    lines = [f"{out / f'{dep}.yaml'}: {', '.join(f'{m.kind} {m.name}' for m in ms)}" for dep, ms in manifests.items()]
    lines.append(f"{out / 'NOTES.md'}: what these manifests cannot express")
    for dep, ns in notes.items():
        lines.append(f"\ndeployment {dep}: not expressed or not checked")
        lines += [textwrap.fill(n, 100, initial_indent="  - ", subsequent_indent="    ", break_long_words=False,
                                break_on_hyphens=False) for n in ns]
    return "\n".join(lines) + "\n"
