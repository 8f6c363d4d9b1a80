"""What LeaderWorkerSet gives a pod, and from which release (kubernetes-sigs/lws, read at its tags).

LWS's pod webhook adds ``LWS_LEADER_ADDRESS`` (``<lws>-<group>.<subdomain>.<namespace>``) and,
from v0.4.0, ``LWS_GROUP_SIZE`` to every container (``pkg/utils/pod/pod_utils.go``
``AddLWSVariables``; it keeps a variable the container already defines). ``LWS_WORKER_INDEX`` is
added only from v0.6.0, so a manifest that must run on older controllers sets it itself from the
pod's worker-index label, as SGLang's LWS examples do
(``docs/references/multi_node_deployment/lws_pd/lws-examples/p.yaml``).
"""

from __future__ import annotations

from typing import Any

API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
MIN_VERSION = "v0.4.0"  # the first release that injects LWS_GROUP_SIZE
INJECTED = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE")  # in every container, from MIN_VERSION on


def worker_index_env() -> dict[str, Any]:
    """``LWS_WORKER_INDEX`` from the pod's label (0 on the leader), whatever the LWS release."""
    return {"name": "LWS_WORKER_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{WORKER_INDEX_LABEL}']"}}}
