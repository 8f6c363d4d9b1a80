#!/usr/bin/env python3
"""Capture the real ``launch_server`` flags of an SGLang release as package data.

Writes, for release VERSION:
  src/gpudeploy/data/sglang-VERSION-launch_server-help.txt   ``parser.format_help()``
  src/gpudeploy/data/sglang-VERSION-launch_server-flags.json every option string of every action

The parser is built as SGLang's own ``prepare_server_args`` builds it (what ``python -m
sglang.launch_server`` and ``sglang serve`` run): ``argparse.ArgumentParser(prog="sglang serve")``
followed by ``ServerArgs.add_cli_args(parser)``.

Installing sglang would pull torch and CUDA (many GB). Instead the wheel is fetched with
``pip download --no-deps`` into a temporary directory, unpacked there, and imported in a child
interpreter that runs without site-packages (``-S``): every import outside the standard library and
the unpacked ``sglang`` package is answered by a permissive stub module. The script refuses to write
anything if a stub object leaked into the flag list (as a choice or an option string) or into the
help text. Nothing fetched is kept: the temporary directory is deleted on exit.

Known to work for 0.5.10 (pure-Python wheel). 0.5.23 (a cp311 wheel) still stops at import time in
sglang/kernels/registry.py: its shipped capture was taken from a real install.

Usage:
  .venv/bin/python scripts/capture_sglang_flags.py 0.5.10
  .venv/bin/python scripts/capture_sglang_flags.py 0.5.10 --wheel /tmp/sgl/sglang-0.5.10-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "src" / "gpudeploy" / "data"
STUB_MARK = "<gpudeploy-stub"


# --------------------------------------------------------------------------------------------------
# Child side: runs in ``python -S`` with the unpacked wheel first on sys.path.
# --------------------------------------------------------------------------------------------------


# Pure-Python packages imported for real (from the capturing interpreter's site-packages): version
# comparisons must give real answers.
REAL = ("packaging",)


def _install_stubs(versions: dict[str, str]) -> None:
    import importlib.abc
    import importlib.machinery
    import types

    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    # Probes that must fail as they do on a host without an accelerator, so that SGLang takes its
    # CPU fallback instead of using a stub where it needs a real value (a device name, ...).
    failing = {"triton.runtime.driver.active"}
    # Attributes that only other platforms' torch builds have (hasattr() probes must say no).
    absent = {"torch.npu", "torch.hpu", "torch.musa"}
    # Plain values a CUDA build of torch has (on a host where torch.cuda.is_available() is false).
    values: dict[str, object] = {
        "torch.version.hip": None,
        "torch.version.musa": None,
        "torch.version.cuda": "12.8",
        # serialises a class at import time (configs/deepseek_ocr.py)
        "dill.dumps": lambda *a, **k: b"",
    }
    classes: dict[str, type] = {}
    # Dunder names Python and the standard library probe for; a stub must not claim to have them.
    # Other dunders (a library's own, e.g. pydantic's __class_validators__) are stubbed like any name.
    protocol = set(dir(type)) | set(dir(types.FunctionType)) | set(dir(types.ModuleType))
    protocol |= {
        "__wrapped__",
        "__signature__",
        "__origin__",
        "__args__",
        "__parameters__",
        "__dataclass_fields__",
        "__path__",
        "__file__",
        "__spec__",
        "__loader__",
        "__all__",
        "__set_name__",
        "__get__",
        "__set__",
        "__delete__",
        "__fspath__",
        "__length_hint__",
        "__copy__",
        "__deepcopy__",
        "__getstate__",
        "__setstate__",
        "__array__",
        "__await__",
        "__aiter__",
        "__anext__",
        "__index__",
        "__iter__",
        "__next__",
        "__version__",
    }

    class Stub:
        """Stands for any object of a stubbed module: callable, subscriptable, subclassable."""

        def __init__(self, path: str) -> None:
            object.__setattr__(self, "_path", path)

        def __repr__(self) -> str:
            return f"{STUB_MARK} {object.__getattribute__(self, '_path')}>"

        __str__ = __repr__

        def __getattr__(self, name: str) -> Stub:
            if name in protocol:
                raise AttributeError(name)
            path = f"{object.__getattribute__(self, '_path')}.{name}"
            if path in absent:
                raise AttributeError(name)
            if path in values:
                return values[path]  # type: ignore[return-value]
            if path in failing:
                raise RuntimeError(f"{path}: no accelerator (stub)")
            return Stub(path)

        def __setattr__(self, name: str, value: object) -> None:
            pass

        def __call__(self, *args: object, **kwargs: object) -> object:
            # Used bare as a decorator (@torch.compile, @triton.jit): hand the function back.
            if len(args) == 1 and not kwargs and isinstance(args[0], types.FunctionType):
                return args[0]
            return Stub(f"{object.__getattribute__(self, '_path')}()")

        def __getitem__(self, key: object) -> Stub:
            return Stub(f"{object.__getattribute__(self, '_path')}[]")

        def __setitem__(self, key: object, value: object) -> None:
            pass

        def __delitem__(self, key: object) -> None:
            pass

        def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
            path = object.__getattribute__(self, "_path")
            if path not in classes:
                classes[path] = type(
                    path.rsplit(".", 1)[-1],
                    (),
                    {
                        "__init__": lambda self, *a, **k: None,
                        "__init_subclass__": classmethod(lambda cls, **k: None),
                        "__repr__": lambda self: f"{STUB_MARK} instance {path}>",
                    },
                )
            return (classes[path],)

        def __instancecheck__(self, obj: object) -> bool:
            return False

        def __subclasscheck__(self, cls: object) -> bool:
            return False

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(())

        def __len__(self) -> int:
            return 0

        def __bool__(self) -> bool:
            return False

        def __contains__(self, item: object) -> bool:
            return False

        def __int__(self) -> int:
            return 0

        __index__ = __int__

        def __float__(self) -> float:
            return 0.0

        def __enter__(self) -> Stub:
            return self

        def __exit__(self, *exc: object) -> bool:
            return False

        def __hash__(self) -> int:
            return id(self)

        def __eq__(self, other: object) -> bool:
            return self is other

        def __lt__(self, other: object) -> bool:
            return False

        __le__ = __gt__ = __ge__ = __lt__

        def _binop(self, *other: object) -> Stub:
            return self

        __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _binop
        __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = _binop
        __neg__ = __pos__ = __invert__ = __and__ = __rand__ = __xor__ = __lshift__ = _binop
        __rshift__ = __matmul__ = _binop

        def __or__(self, other: object) -> object:
            return self

        __ror__ = __or__

    class StubModule(types.ModuleType):
        def __getattr__(self, name: str) -> Stub:
            path = f"{self.__name__}.{name}"
            if (name.startswith("__") and name.endswith("__")) or path in absent:
                raise AttributeError(name)
            if path in values:
                return values[path]  # type: ignore[return-value]
            return Stub(path)

    class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
            top = fullname.partition(".")[0]
            if top in stdlib or top == "sglang" or top in REAL:
                return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            mod = StubModule(spec.name)
            mod.__path__ = []
            # The version the wheel pins (torch==2.9.1 ...); SGLang branches on some of them.
            mod.__version__ = versions.get(spec.name, "0.0.0")
            return mod

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            pass

    sys.meta_path.insert(0, StubFinder())


def _flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, object]]:
    flags: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        choices = None if action.choices is None else [str(c) for c in action.choices]
        # takes_value: argparse consumes an argument after the option (store, append, ...), i.e.
        # every action except the zero-argument ones (store_true/false/const, count, help, version).
        info = {"choices": choices, "nargs": action.nargs, "takes_value": action.nargs != 0}
        for opt in action.option_strings:
            if opt in flags:
                raise SystemExit(f"duplicate option string {opt}")
            flags[opt] = info
    return flags


def _pinned_versions(root: str) -> dict[str, str]:
    """Module name -> version for the unconditional ``name==version`` requirements of the wheel."""
    import re

    meta = next(Path(root).glob("sglang-*.dist-info/METADATA")).read_text()
    found = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)==([^;,\s]+)\s*$", meta, re.M)
    return {name.lower().replace("-", "_"): ver for name, ver in found}


def _child(root: str, version: str, out_dir: str, real_path: str) -> None:
    sys.path.insert(0, root)
    sys.path.append(real_path)
    _install_stubs(_pinned_versions(root))
    import warnings

    warnings.simplefilter("ignore")
    from sglang.srt import server_args  # type: ignore[import-not-found]

    # As prepare_server_args() in sglang/srt/server_args.py builds it.
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)

    help_text = parser.format_help()
    flags = _flags(parser)
    blob = json.dumps(flags) + help_text
    if STUB_MARK in blob:
        line = next(x for x in blob.replace("\\n", "\n").splitlines() if STUB_MARK in x)
        raise SystemExit(f"a stub object leaked into the capture: {line.strip()[:200]}")
    for opt, info in flags.items():
        for c in info["choices"] or []:  # type: ignore[attr-defined]
            if STUB_MARK in c:
                raise SystemExit(f"{opt}: stub object among the choices")

    out = Path(out_dir)
    (out / f"sglang-{version}-launch_server-help.txt").write_text(help_text)
    (out / f"sglang-{version}-launch_server-flags.json").write_text(
        json.dumps({"sglang": version, "flags": flags}, indent=1, sort_keys=True)
    )
    print(f"sglang {version}: {len(flags)} option strings, {len(parser._actions)} actions")


# --------------------------------------------------------------------------------------------------
# Parent side: fetch, unpack, run the child.
# --------------------------------------------------------------------------------------------------


def _download(version: str, dest: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"sglang=={version}",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            str(dest),
        ],
        check=True,
    )
    wheels = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one sglang {version} wheel in {dest}, found {wheels}")
    return wheels[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("version", help="SGLang release, e.g. 0.5.10")
    ap.add_argument("--wheel", type=Path, help="use this already downloaded wheel instead of pip download")
    ap.add_argument("--out", type=Path, default=DATA, help=f"output directory (default {DATA})")
    ap.add_argument("--child", nargs=3, metavar=("ROOT", "OUT", "REAL"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        _child(args.child[0], args.version, args.child[1], args.child[2])
        return

    with tempfile.TemporaryDirectory(prefix="sglang-capture-") as tmp:
        wheel = args.wheel or _download(args.version, Path(tmp) / "dl")
        root = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
        meta = next(root.glob("sglang-*.dist-info/METADATA")).read_text()
        got = next(ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Version:"))
        if got != args.version:
            raise SystemExit(f"{wheel} is sglang {got}, not {args.version}")
        args.out.mkdir(parents=True, exist_ok=True)
        import packaging

        real_path = str(Path(packaging.__file__).parent.parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        # COLUMNS fixes argparse's wrap width; the hash seed fixes the order of choices that
        # SGLang keeps in sets (e.g. --sampling-backend).
        env.update(COLUMNS="80", PYTHONHASHSEED="0")
        subprocess.run(
            [
                sys.executable,
                "-S",
                str(Path(__file__).resolve()),
                args.version,
                "--child",
                str(root),
                str(args.out.resolve()),
                real_path,
            ],
            check=True,
            env=env,
            cwd=tmp,
        )


if __name__ == "__main__":
    main()
