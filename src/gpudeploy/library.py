"""The role library and the unit templates that ship inside the package, and the lookup that lets an
inventory's own ``roles_dir``/``templates_dir`` override them file by file.

A placed role ``R`` is ``<roles_dir>/R.yml`` when the inventory's roles directory has that file, else
the packaged ``gpudeploy/roles/R.yml``; a template likewise (Jinja searches the inventory's
``templates_dir`` first, then the packaged one). So an inventory kept in its own repository needs
no copy of either, and a role file of the same name in its ``roles_dir`` wins.

In the repository the library lives at the top (``roles/``, ``templates/``) and ``gpudeploy/roles`` and
``gpudeploy/templates`` are symlinks to it; installed from a wheel they are the files themselves. Either
way they are the folders beside this module, so nothing here depends on how gpudeploy was installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKAGED_ROLES = Path(__file__).parent / "roles"
PACKAGED_TEMPLATES = Path(__file__).parent / "templates"
PACKAGED = "packaged"


@dataclass(frozen=True)
class RoleFile:
    """One role file that a placement of ``name`` would read."""

    name: str
    path: Path
    source: str  # "packaged", or the inventory's roles_dir it was found in
    overrides: bool = False  # a roles_dir file that hides the packaged role of the same name


def role_dirs(roles_dir: Path | None) -> list[tuple[Path, str]]:
    """Where role files are looked for, in order: the inventory's directory (when it has one), the package."""
    out: list[tuple[Path, str]] = []
    if roles_dir is not None and roles_dir.is_dir() and roles_dir.resolve() != PACKAGED_ROLES.resolve():
        out.append((roles_dir, str(roles_dir)))
    out.append((PACKAGED_ROLES, PACKAGED))
    return out


def find_role(name: str, roles_dir: Path | None) -> RoleFile | None:
    """The file a placement of role ``name`` reads (``name`` is a plain name, checked by the inventory)."""
    for folder, source in role_dirs(roles_dir):
        path = folder / f"{name}.yml"
        if path.is_file():
            hides = source != PACKAGED and (PACKAGED_ROLES / f"{name}.yml").is_file()
            return RoleFile(name, path, source, hides)
    return None


def misnamed(name: str, roles_dir: Path | None) -> list[Path]:
    """Files of the inventory's roles folder that look meant as role ``name`` but are not read as it:
    ``decode.yaml``, ``Decode.yml`` (a role is read only from ``<name>.yml``, exactly)."""
    out: list[Path] = []
    for folder, source in role_dirs(roles_dir):
        if source == PACKAGED:
            continue
        for path in sorted(folder.iterdir()):
            if path.name != f"{name}.yml" and path.suffix.lower() in (".yml", ".yaml") \
                    and path.stem.lower() == name.lower():
                out.append(path)
    return out


def available_roles(roles_dir: Path | None) -> list[RoleFile]:
    """Every role a placement may name, by name: the inventory's roles, then the packaged ones it does
    not override."""
    found: dict[str, RoleFile] = {}
    for folder, _ in role_dirs(roles_dir):
        for path in sorted(folder.glob("*.yml")):
            if path.stem not in found:
                role = find_role(path.stem, roles_dir)
                if role is not None:
                    found[path.stem] = role
    return [found[n] for n in sorted(found)]


def template_dirs(templates_dir: str | Path | None) -> list[Path]:
    """Jinja's search path: the inventory's templates (when it has them), then the packaged ones."""
    out: list[Path] = []
    if templates_dir:
        mine = Path(templates_dir)
        if mine.is_dir() and mine.resolve() != PACKAGED_TEMPLATES.resolve():
            out.append(mine)
    out.append(PACKAGED_TEMPLATES)
    return out
