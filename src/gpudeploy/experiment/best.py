"""The best variant as files ``deploy`` takes as they are: role files, and an inventory that reads them.

    <results>/best/roles/<role>.yml   each role the variant overrides: its own role file, the overrides
                                      applied (settings and env merged, null removing a key; the TP
                                      size, the checkpoint, extra_args set), everything else as it was
    <results>/best/roles/<other>.yml  the inventory's other roles read from its roles_dir, copied as they are
    <results>/best/hosts.yml          the inventory, its roles_dir this folder (and a templates_dir of its
                                      own made absolute): ``gpudeploy deploy --inventory <results>/best/hosts.yml``

A role file is what a deployment is made of (the inventory places roles, it overrides none of their
keys), so the overrides land in a copy of the role file; to keep your own inventory, copy the
written role files into its roles_dir. The packaged roles need no copy: the package has them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError, Problem
from ..inventory import load_inventory
from ..library import PACKAGED_ROLES


def write_best(inventory: str, overrides: dict[str, dict[str, Any]], folder: Path, header: str) -> list[Path]:
    """Write the best variant's role files and inventory into ``folder`` (replaced whole); the files
    written, the inventory first."""
    problems: list[Problem] = []
    inv = load_inventory(inventory, problems)
    if problems:
        raise InputError(problems)
    by_file: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, ov in overrides.items():
        role = inv.roles.get(name)
        if role is None:  # a role file whose instances are placed: the file is the role read
            role = next((r for r in inv.roles.values() if r.file_role == name), None)
        if role is None:
            raise InputError([Problem(f"role {name!r} is not placed by {inventory}", file=inventory, key="roles")])
        if role.file_role != name:
            raise InputError([Problem(f"the search sets keys of {name}, one instance of role file {role.file_role}: "
                                      "a role file sets every instance; name the role file in the space",
                                      file=inventory, role=name, key="roles")])
        by_file[name] = (role.file, ov)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "roles").mkdir(parents=True)
    written = []
    for r in {r.file_role: r for r in inv.roles.values()}.values():
        source = Path(r.file)
        if r.file_role in by_file:
            continue
        if source.resolve().parent != PACKAGED_ROLES.resolve():
            shutil.copyfile(source, tmp / "roles" / f"{r.file_role}.yml")
    for name, (source_file, ov) in sorted(by_file.items()):
        doc = yaml.safe_load(Path(source_file).read_text()) or {}
        text = f"# {header}\n# from {source_file}, with: {_flat(ov)}\n" + yaml.safe_dump(apply(doc, ov),
                                                                                            sort_keys=False)
        (tmp / "roles" / f"{name}.yml").write_text(text)
        written.append(folder / "roles" / f"{name}.yml")
    (tmp / "hosts.yml").write_text(f"# {header}\n# {inventory}, reading the roles of this folder's roles/\n"
                                   + yaml.safe_dump(_inventory(inventory, inv.templates_dir), sort_keys=False))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return [folder / "hosts.yml", *written]


def apply(doc: dict[str, Any], ov: dict[str, Any]) -> dict[str, Any]:
    """A role file's data with one variant's overrides (as variants.override_role applies them)."""
    out = dict(doc)
    for section in ("settings", "env"):
        if section in ov:
            merged = dict(out.get(section) or {})
            for k, v in ov[section].items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
            out[section] = merged
    if "model" in ov:
        model = dict(out.get("model") or {})
        if "path" in ov["model"] and ov["model"]["path"] != model.get("path"):
            model.pop("facts", None)  # they describe the other checkpoint
        model.update(ov["model"])
        out["model"] = model
    for key in ("tp_size", "extra_args"):
        if key in ov:
            out[key] = ov[key]
    return out


def _inventory(path: str, templates_dir: str) -> dict[str, Any]:
    """The inventory's data, read from its new folder as from its own: roles from ``roles/`` there, the
    templates it read (its templates_dir, or ../templates found beside it) and ssh files by absolute path."""
    base = Path(path).parent
    doc = dict(yaml.safe_load(Path(path).read_text()) or {})
    doc["roles_dir"] = "roles"
    doc.pop("templates_dir", None)
    if templates_dir:
        doc["templates_dir"] = os.path.normpath(base / templates_dir)
    sections = [doc.get("defaults")] + [h for h in (doc.get("hosts") or {}).values()]
    for section in sections:
        ssh = section.get("ssh") if isinstance(section, dict) else None
        for key in ("key", "known_hosts"):
            if isinstance(ssh, dict) and isinstance(ssh.get(key), str) and not ssh[key].startswith(("/", "~")):
                ssh[key] = os.path.normpath(base / ssh[key])  # the inventory reads it relative to itself
    return doc


def _flat(ov: dict[str, Any]) -> str:
    parts = []
    for section, values in ov.items():
        if isinstance(values, dict):
            parts += [f"{section}.{k}={'null' if v is None else v}" for k, v in values.items() if k != "facts"]
        else:
            parts.append(f"{section}={values}")
    return ", ".join(parts)
