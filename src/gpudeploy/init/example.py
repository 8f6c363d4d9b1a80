"""``gpudeploy init --example``: a commented example inventory to edit, for a user with no host at
hand yet (``init --host`` needs SSH to each host), and the packaged roles copied beside it to edit.

The inventory goes to ``--out`` (default ``inventory/hosts.yml``); the roles to where gpudeploy reads
an inventory's own roles by default, ``../roles`` from the inventory's folder (``./roles`` for an
inventory in the current folder itself), and the file names that folder in ``roles_dir``. Nothing is
overwritten without ``--force``, and nothing is written when any of the files exists.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import InputError, Problem
from ..library import PACKAGED_ROLES

EXAMPLE = """\
# An example inventory written by `gpudeploy init --example`: one 8-GPU node serving one model with
# prefill/decode disaggregation. Replace what this node is with what yours is, then
#   gpudeploy plan   (touches nothing: what would run where, memory verdicts, a recap; exit 2: deploy refuses)
#   gpudeploy deploy
# `gpudeploy init --host ADDRESS` writes one like it from the hosts' own facts (NVML, NUMA, CPUs, engines).
deployment: pd                      # units are named gpudeploy-pd.<role>.service

# The role files placed below (prefill, decode, router): copies of gpudeploy's packaged ones, to edit.
# model.path and model.facts say which model is served and how big it is; settings are SGLang's
# flags with underscores (mem_fraction_static: 0.7 is --mem-fraction-static 0.7).
roles_dir: {roles_dir}

defaults:
  ssh:
    user: root                      # or leave ssh out: ~/.ssh/config, your agent and keys decide
    # key: ~/.ssh/id_ed25519
    # known_hosts: ~/.ssh/known_hosts   # host keys are always checked, never added
  gpu_memory_gib: 95.6              # GiB per GPU as NVML reports it: 95.6 for a "96 GB" card, 79.6 for an H100
  engine_versions:
    sglang: "0.5.23"                # the release installed on the hosts: flags are checked against it
    sglang_router: "0.3.2"
  python: /opt/sglang/.venv/bin/python  # the interpreter that has sglang (and sglang_router) installed
  numa_policy: bind                 # each GPU unit's memory on its NUMA node

hosts:
  node1:                            # the name gpudeploy uses (--host node1)
    address: 10.0.0.1               # how to reach it over ssh
    numa_nodes:                     # `nvidia-smi topo -m` and `lscpu` tell which GPUs and CPUs are whose
      - {{id: 0, gpus: [0, 1, 2, 3], cpus: "0-31,64-95"}}
      - {{id: 1, gpus: [4, 5, 6, 7], cpus: "32-63,96-127"}}
    roles:
      - {{role: prefill, numa_node: 0}}   # TP4 (tp_size in its role file): GPUs 0-3
      - {{role: decode, numa_node: 1}}    # TP4: GPUs 4-7
      - router                      # the OpenAI-compatible endpoint, in front of both (no GPU)
"""


def roles_folder(out: Path) -> Path:
    """Where gpudeploy looks for an inventory's own roles when roles_dir is not given: ``../roles``
    from the inventory's folder; an inventory in the current folder itself gets ``./roles``."""
    return out.parent / "roles" if out.parent == Path() else Path(os.path.normpath(out.parent / ".." / "roles"))


def write_example(out_path: str, *, force: bool = False) -> str:
    """Write the example and the role files; the report to print (what was written, what to edit next)."""
    out = Path(out_path)
    roles = roles_folder(out)
    packaged = sorted(PACKAGED_ROLES.glob("*.yml"))
    targets = [out, *(roles / p.name for p in packaged)]
    if not force:
        there = [str(t) for t in targets if t.exists()]
        if there:
            raise InputError([Problem(f"{', '.join(there)} already exist(s); init --example never overwrites "
                                      "(--force does, or --out names another inventory)", key="--out")])
    relative = os.path.relpath(roles, out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    roles.mkdir(parents=True, exist_ok=True)
    for p in packaged:
        shutil.copyfile(p, roles / p.name)
    out.write_text(EXAMPLE.format(roles_dir=relative))
    return "\n".join([
        f"wrote {out} (an example: one 8-GPU node, TP4 prefill on NUMA node 0, TP4 decode on NUMA node 1, a router)",
        f"copied the packaged roles to {roles}/ ({', '.join(p.stem for p in packaged)}); yours to edit",
        "next:",
        f"  1. {out}: each host's address, numa_nodes (GPUs and CPUs per NUMA node), gpu_memory_gib, "
        "engine_versions and python",
        f"  2. {roles}/prefill.yml and decode.yml: model.path (and model.facts, or a model dir readable here), "
        "tp_size, settings",
        f"  3. gpudeploy plan -i {out}   (touches nothing; exit 2 if deploy would refuse), "
        f"then gpudeploy deploy -i {out}",
    ])
