"""The same inventory and roles as Kubernetes manifests: ``invoke render --target k8s [--out DIR]``.

    plan (pure) -> build.py (dicts per deployment) -> write.py (YAML) -> validate.py (read back,
    checked against the LeaderWorkerSet CRD and Kubernetes' own schemas) and envrefs.py (every
    $(VAR) of a container's command and args is defined for it) -> files or stdout

Nothing is written unless every manifest of every deployment validates. notes.py says, per
deployment, what a manifest cannot express (NUMA binding, GPU indices, hosts, deploy's checks).
Pure: reads the inventory, never a host or a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from ..errors import InputError, Problem
from ..model import Plan
from ..plan import load_plan
from .build import Options, build
from .envrefs import undefined_references
from .notes import deployment_notes
from .roleset import Manifest, role_sets
from .validate import K8S_VERSION, manifest_problems
from .write import notes_text, stream

if TYPE_CHECKING:
    from ..plan.calibrate import CalibrationStore

__all__ = ["Manifest", "Options", "Rendered", "render"]


@dataclass(frozen=True)
class Rendered:
    inventory: str
    manifests: dict[str, list[Manifest]]  # deployment -> its manifests, in apply order
    notes: dict[str, list[str]]  # deployment -> what its manifests cannot express
    streams: dict[str, str]  # deployment -> its YAML (notes as a comment header)
    plan: Plan  # what was rendered (with the memory preflight's verdicts when render was asked for them)

    def files(self) -> dict[str, str]:
        """What ``--out DIR`` holds: ``<deployment>.yaml`` each, and NOTES.md."""
        return {**{f"{dep}.yaml": text for dep, text in self.streams.items()},
                "NOTES.md": notes_text(self.inventory, self.notes)}


def render(inventory: str, options: Options | None = None, deployment: str | None = None, *,
           memory: bool = False, store: CalibrationStore | None = None) -> Rendered:
    """Every deployment of the inventory (or ``deployment``) as validated manifests.

    Raises InputError with every problem: the plan's, what Kubernetes cannot represent, and every
    schema error of what was rendered (each naming the manifest, its role and the schema path).
    ``memory``: also run the memory preflight (with what earlier runs measured, ``store``), whose
    verdicts the plan then carries; Kubernetes checks no GPU memory itself.
    """
    options = options or Options()
    plan = load_plan(inventory, deployment=deployment, memory=memory, store=store)
    manifests = build(plan, options)
    sets = role_sets(plan)
    notes = {dep: deployment_notes(sets[dep], manifests[dep], options, K8S_VERSION) for dep in manifests}
    streams = {dep: stream(dep, inventory, ms, notes[dep]) for dep, ms in manifests.items()}
    problems: list[Problem] = []
    for dep, text in streams.items():
        # What is checked is what a user applies: the YAML read back, not the dicts it came from.
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        for m, doc in zip(manifests[dep], docs, strict=True):
            problems += manifest_problems(m, doc)
        problems += undefined_references(manifests[dep], docs)
    if problems:
        raise InputError(problems)
    return Rendered(inventory=inventory, manifests=manifests, notes=notes, streams=streams, plan=plan)
