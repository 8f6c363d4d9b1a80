"""Values that flow one way: inventory -> plan -> apply -> verify. All frozen.

A ``Host`` and a ``Role`` are the user's facts as parsed; a ``Unit`` is one systemd service the plan
decided on (a role placed on a host, with GPUs, ports, argv and rendered files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENGINES = ("sglang", "sglang_router", "command")
LOG_FORMATS = ("sglang", "vllm")  # which failure-cause/phase table reads a role's log
# A rolling update's temporary copy of an engine runs as ``<role>-surge`` (apply/surges.py): reserved,
# so that no planned unit can be taken for such a copy.
SURGE_SUFFIX = "-surge"


@dataclass(frozen=True)
class Where:
    """Where a value came from, for error messages."""

    file: str
    line: int | None = None


@dataclass(frozen=True)
class NumaNode:
    id: int
    gpus: tuple[int, ...]
    cpus: str  # systemd CPU list syntax, e.g. "0-31,64-95"
    memory_gib: float | None = None  # its RAM; only Kubernetes rendering reads it (memory requests)


@dataclass(frozen=True)
class K8sSettings:
    """``kubernetes:`` of the inventory (``defaults``, a host) or of a role: what only
    ``invoke render --target k8s`` reads. None means "not given here", so a host's settings can be
    laid under a role's (``under``); ``where`` names the file and line each given key came from."""

    node_selector: dict[str, str] | None = None
    tolerations: tuple[dict[str, Any], ...] | None = None
    affinity: dict[str, Any] | None = None
    rdma_resource: str | None = None  # an RDMA device plugin's resource, e.g. rdma/ib
    socket_ifname: str | None = None  # GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME
    reserved_cpus: int | None = None  # per NUMA node: what the kubelet, the system and daemonsets keep
    reserved_memory_gib: float | None = None
    privileged: bool | None = None
    host_network: bool | None = None
    qos: str | None = None  # burstable or guaranteed
    cpus: int | None = None  # per pod, instead of its share of its NUMA node
    memory_gib: float | None = None
    shm_gib: float | None = None  # the /dev/shm emptyDir's sizeLimit
    service_discovery: bool | None = None  # routers: find the workers by their pods' labels
    where: dict[str, Where] = field(default_factory=dict)

    def under(self, top: K8sSettings) -> K8sSettings:
        """These settings with ``top``'s laid over them: ``top``'s values win, its node_selector
        keys are added to these, its tolerations follow these."""
        merged: dict[str, Any] = {}
        for name in K8S_FIELDS:
            mine, theirs = getattr(self, name), getattr(top, name)
            if name == "node_selector" and mine is not None and theirs is not None:
                merged[name] = {**mine, **theirs}
            elif name == "tolerations" and mine is not None and theirs is not None:
                merged[name] = mine + tuple(t for t in theirs if t not in mine)
            else:
                merged[name] = theirs if theirs is not None else mine
        return K8sSettings(**merged, where={**self.where, **top.where})


K8S_FIELDS = tuple(n for n in K8sSettings.__dataclass_fields__ if n != "where")


@dataclass(frozen=True)
class SshHop:
    """A jump host (bastion) on the way to a host: ssh -J, with host keys checked on this hop too."""

    address: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 5.0


@dataclass(frozen=True)
class SshConfig:
    user: str | None = None  # None: ~/.ssh/config's User, else your login name (as ssh does)
    port: int | None = None  # None: ~/.ssh/config's Port, else 22
    key: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 5.0
    proxy_jump: SshHop | None = None  # the bastion in between; None: ~/.ssh/config's ProxyJump, if any


@dataclass(frozen=True)
class PlacementRequest:
    """One entry of a host's ``roles:`` list.

    ``role`` is the name the placed server goes by (its unit, ports and GPUs are keyed by it): the role
    file's name, or for a named instance (``{role: decode, name: decode-a}``) the instance's name, with
    ``role_file`` naming the file. One role file so serves many instances, each with its own GPUs and
    ports (``port``/``ports`` of the entry)."""

    role: str
    numa_node: int | None = None
    gpus: tuple[int, ...] | None = None
    deployment: str | None = None  # None: the host's
    where: Where | None = None
    role_file: str | None = None  # a named instance's role file; None: the file named ``role``
    ports: dict[str, int] = field(default_factory=dict)  # this placement's own ports (``port`` is http)

    @property
    def file_role(self) -> str:
        return self.role_file or self.role


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    ssh: SshConfig
    numa_nodes: tuple[NumaNode, ...]
    gpu_memory_gib: dict[int, float]  # per GPU index
    engine_versions: dict[str, str]  # engine -> release, e.g. {"sglang": "0.5.23"}
    python: str
    bind_address: str
    numa_policy: str  # systemd NUMAPolicy= for GPU units: bind, preferred, interleave, or none
    env: dict[str, str]
    placements: tuple[PlacementRequest, ...]
    where: Where | None = None
    deployment: str = "default"  # the deployment its placements belong to unless they say otherwise
    supervisor: str = "auto"  # systemd, process (no systemd there), or auto: what the host runs
    connection: str = "ssh"  # ssh, or local: gpudeploy runs on this host itself
    kubernetes: K8sSettings = field(default_factory=K8sSettings)  # defaults.kubernetes under the host's

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for n in self.numa_nodes for g in n.gpus)

    def numa_of(self, gpu: int) -> int:
        for node in self.numa_nodes:
            if gpu in node.gpus:
                return node.id
        raise KeyError(gpu)


# How long a start may show no progress (no log line, no new phase, checkpoint shard or CUDA-graph
# batch) before the gate calls it stalled, per phase of verify/gate.py's PHASE_ORDER. Generous where
# the log is silent by nature: under systemd a whole CUDA-graph capture is ONE journal record, written
# when tqdm's bar closes (gpudeploy_lab/standin/progress.py), and captures take 12 s for a target and
# 63 s for an EAGLE draft (sglang#10088), with torch.compile "tens of minutes" on DeepSeek (sglang#6830);
# a multi-node rank waits for its peers while "starting"; checkpoint shards (~5 GB each) print a line
# apiece. A real hang is longer still: sglang#6017's capture deadlock was noticed by torch's own
# timeout after 30 minutes.
STALL_DEFAULTS_S: dict[str, float] = {
    "starting": 300.0,
    "loading weights": 300.0,
    "allocating KV cache": 300.0,
    "capturing CUDA graphs": 900.0,
    "starting HTTP server": 300.0,
    "warmup": 300.0,
}
ON_STALL = ("wait", "stop")  # a stalled start is reported, then waited out to health.timeout_s, or stopped


@dataclass(frozen=True)
class Health:
    path: str = "/health"
    timeout_s: float = 1200.0
    interval_s: float = 0.25
    drain_s: float = 60.0  # a rolling update: how long an engine's in-flight requests may take to finish
    stall_s: dict[str, float] = field(default_factory=lambda: dict(STALL_DEFAULTS_S))  # phase -> seconds
    on_stall: str = "wait"
    py_spy: str | None = None  # py-spy on the host, for a stalled server's Python stacks (else looked for)

    def stall_after(self, phase: str) -> float:
        return self.stall_s.get(phase, STALL_DEFAULTS_S.get(phase, max(STALL_DEFAULTS_S.values())))


@dataclass(frozen=True)
class Smoke:
    """A router's final gate: one real generation through it, which must return text."""

    endpoint: str = "/generate"  # or /v1/completions, /v1/chat/completions
    prompt: str = "Say hello."
    max_tokens: int = 8
    timeout_s: float = 60.0
    model: str | None = None  # OpenAI endpoints: default the upstreams' served_model_name


@dataclass(frozen=True)
class Role:
    name: str  # the role file's name, or a named instance's (PlacementRequest.role)
    engine: str
    file: str
    description: str = ""
    tp_size: int = 1  # the whole TP group: with nnodes > 1, each node runs tp_size / nnodes ranks
    nnodes: int = 1  # hosts one engine spans (SGLang --nnodes): one unit per host, one group
    gpus: int | None = None  # GPUs needed per host; defaults to tp_size / nnodes for sglang, 0 for the router
    allow_span_numa: bool = False
    version: str | None = None  # pins the engine release; else the host's
    model: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()  # command engine only: Jinja templates, one per argument
    ports: dict[str, int] = field(default_factory=dict)
    upstreams: dict[str, tuple[str, ...]] = field(default_factory=dict)  # router: prefill/decode role names
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    health: Health = field(default_factory=Health)
    stop_timeout_s: float = 30.0
    log_format: str = "sglang"  # verify.causes table: sglang or vllm
    python: str | None = None  # this role's interpreter (e.g. a router venv); else the host's
    smoke: Smoke | None = None  # routers: the generation that gates the deployment
    kubernetes: K8sSettings = field(default_factory=K8sSettings)  # render --target k8s only
    lines: dict[str, int] = field(default_factory=dict)  # key -> line in the role file
    instance_of: str = ""  # a named instance's role file (roles: [{role: decode, name: decode-a}]); "" if none

    @property
    def file_role(self) -> str:
        """The role file this role was read from (upstreams and --role may name it for its instances)."""
        return self.instance_of or self.name

    def named_in(self, names: tuple[str, ...] | list[str] | set[str]) -> bool:
        """``names`` (a router's upstreams of one kind, say) names this role or its role file: a named
        instance, ``{role: decode, name: decode-a}``, is fronted as ``decode`` (plan/build.py's router
        argv follows the same rule)."""
        return self.name in names or self.file_role in names

    @property
    def gpus_needed(self) -> int:
        if self.gpus is not None:
            return self.gpus
        return self.tp_size // self.nnodes if self.engine == "sglang" else 0


@dataclass(frozen=True)
class Inventory:
    path: str
    deployment: str  # the default deployment (hosts and placements may name others)
    hosts: dict[str, Host]
    roles: dict[str, Role]  # by the name each is placed under (a named instance under its own name)
    templates_dir: str  # the inventory's own templates ("": the packaged ones only; library.template_dirs)
    roles_dir: str = ""  # the inventory's own role files ("": the packaged ones only)


@dataclass(frozen=True)
class Group:
    """A multi-node engine: one unit per host (a node rank each), started together, one result.

    Rank 0 (the leader, first of the hosts that place the role, in inventory order) serves the API
    and the torch.distributed store on ``dist_init``; the other ranks only compute and answer
    ``/health`` once their schedulers are ready (SGLang's dummy health server on non-zero ranks).
    """

    nnodes: int
    rank: int
    members: tuple[str, ...]  # host names, by node rank
    dist_init: str  # the leader's ADDRESS:PORT (SGLang --dist-init-addr)

    @property
    def leader(self) -> str:
        return self.members[0]


@dataclass(frozen=True)
class Unit:
    """One systemd service on one host: everything apply needs, nothing it must compute."""

    deployment: str
    host: Host
    role: Role
    name: str  # e.g. gpudeploy-pd-decode.service
    engine_version: str | None
    gpus: tuple[int, ...]
    numa_node: int | None
    cpus: str | None
    ports: dict[str, int]
    argv: tuple[str, ...]
    env: dict[str, str]  # public values
    secret_names: tuple[str, ...]  # values come from the deploying user's environment
    unit_path: str
    env_path: str
    state_dir: str
    health_url: str
    files: dict[str, str]  # path -> text, secrets masked
    memory: dict[str, Any] | None = None
    # a release gpudeploy has not captured, planned offline: the captured release whose flags it uses
    flags_release: str = ""
    group: Group | None = None  # set when the role spans hosts (nnodes > 1)
    # an offline plan's flags that the stand-in release lacks but another captured release has
    flag_notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.host.name}/{self.role.name}"


@dataclass(frozen=True)
class Plan:
    inventory: Inventory
    units: tuple[Unit, ...]
