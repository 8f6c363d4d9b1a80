"""Files shipped with a variant (``files: {ENV_NAME: local/path}`` in its overrides): tuned MoE kernel
configs and the like, which the field copied to each host by hand and pointed the engine at by env
(SGLang reads ``SGLANG_MOE_CONFIG_DIR``, vLLM ``VLLM_TUNED_CONFIG_FOLDER``).

A source is a regular file or a folder of regular files beside the experiment file (no symlinks, at
most ``MAX_FILES`` files and ``MAX_BYTES`` in all), read once when the experiment is loaded. On a host
it lands, content-addressed, in ``/var/lib/gpudeploy/shipped/<digest>/``: one tar stream over the
connection, unpacked into a temporary folder there and renamed into place, so the engine sees the
whole set or nothing, and two variants that ship different files can never mix them. The variable
names that folder (or, for one file, the file in it). The digest is part of the variant's key: an
edited file runs the variant again.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..remote.base import Transport

SHIPPED_ROOT = "/var/lib/gpudeploy/shipped"
MAX_FILES = 1024
MAX_BYTES = 64 << 20

# Runs on the host: argv ROOT FINAL; the tar stream on stdin. A folder already there is the same
# content (its name is the digest); otherwise unpack beside it and rename: whole or not at all.
UNPACK = r"""set -eu
root=$1 final=$2
if [ -d "$final" ]; then cat >/dev/null; exit 0; fi
umask 022
mkdir -p "$root"
tmp=$(mktemp -d "$root/.incoming.XXXXXXXX")
trap 'rm -rf "$tmp"' EXIT
tar -x --no-same-owner --no-same-permissions -f - -C "$tmp"
chmod 755 "$tmp"
if mv -T "$tmp" "$final" 2>/dev/null; then trap - EXIT; else test -d "$final"; fi
"""


@dataclass(frozen=True)
class Bundle:
    """One ``files:`` entry, read: what goes to the hosts and where its variable points."""

    env: str
    source: str  # as the experiment file gives it
    files: tuple[tuple[str, bytes], ...]  # relative path -> content, sorted
    single: bool  # the source is one file (the variable names the file, not the folder)

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for rel, data in self.files:
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()[:20]

    @property
    def folder(self) -> str:
        return f"{SHIPPED_ROOT}/{self.digest}"

    @property
    def target(self) -> str:
        """What the variable is set to on the host."""
        return f"{self.folder}/{self.files[0][0]}" if self.single else self.folder

    @property
    def size(self) -> int:
        return sum(len(d) for _, d in self.files)

    def summary(self) -> dict[str, object]:
        """What the variant's key and the store keep of it (not the content)."""
        return {"source": self.source, "sha256": self.digest, "files": len(self.files), "bytes": self.size}


def read_bundle(env: str, source: str, base: Path) -> Bundle | str:
    """The files of ``source`` (relative to ``base``, the experiment file's folder), or why not."""
    path = Path(source).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        top = path.lstat()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(top.st_mode):
        return f"{path} is a symlink; ship the file or folder itself"
    if stat.S_ISREG(top.st_mode):
        return _bundle(env, source, [(path.name, path)], single=True)
    if not stat.S_ISDIR(top.st_mode):
        return f"{path} is neither a regular file nor a folder"
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(path):
        for name in sorted(dirs) + sorted(names):
            p = Path(folder) / name
            mode = p.lstat().st_mode
            if stat.S_ISLNK(mode):
                return f"{p} is a symlink; only regular files and folders are shipped"
            if stat.S_ISREG(mode):
                found.append((p.relative_to(path).as_posix(), p))
            elif not stat.S_ISDIR(mode):
                return f"{p} is neither a regular file nor a folder"
        dirs.sort()
    if not found:
        return f"{path} holds no files"
    return _bundle(env, source, sorted(found), single=False)


def _bundle(env: str, source: str, paths: list[tuple[str, Path]], single: bool) -> Bundle | str:
    if len(paths) > MAX_FILES:
        return f"{source}: {len(paths)} files; at most {MAX_FILES} are shipped"
    bad = next((rel for rel, _ in paths if not rel.isprintable() or rel.startswith("-")), None)
    if bad is not None:
        return f"{source}: the file name {bad!r} cannot be shipped (control characters or a leading -)"
    files: list[tuple[str, bytes]] = []
    total = 0
    for rel, p in paths:
        try:
            data = p.read_bytes()
        except OSError as exc:
            return f"cannot read {p}: {exc.strerror or exc}"
        total += len(data)
        if total > MAX_BYTES:
            return f"{source}: more than {MAX_BYTES >> 20} MiB; ship less (a model belongs under model.path)"
        files.append((rel, data))
    return Bundle(env, source, tuple(files), single)


def tar_bytes(bundle: Bundle) -> bytes:
    """The bundle as a tar stream: regular files 0644 in folders 0755, owned by nobody in particular."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({str(Path(rel).parent) for rel, _ in bundle.files} - {"."})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for rel, data in bundle.files:
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def upload(remote: Transport, bundle: Bundle) -> None:
    """Put the bundle on the host: whole or not at all, once per content (RemoteError if it failed)."""
    remote.run(["sh", "-c", UNPACK, "unpack", SHIPPED_ROOT, bundle.folder], stdin=tar_bytes(bundle), timeout=300)
