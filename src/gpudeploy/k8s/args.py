"""A unit's planned argv -> the container's command and args.

The plan's argv is host-specific: the host's interpreter, ``--host <bind_address>``, a multi-node
rank's ``--dist-init-addr <leader address>:<port> --nnodes N --node-rank R``, and a router's
upstream URLs by host address. In a pod the interpreter is the image's ``python3``, the server
binds every address of its pod, a rank learns its leader and index from LeaderWorkerSet (which
sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX in every container), and a router
reaches its engines by their Services' DNS names. Everything else (flag spellings of the release,
settings, extra_args) is the plan's, word for word.

Kubernetes expands ``$(NAME)`` in args and turns ``$$`` into ``$``: every ``$`` of a planned word is
doubled, so only the LWS references inserted here expand.
"""

from __future__ import annotations

from ..model import Unit

CONTAINER_PYTHON = "python3"  # the interpreter on PATH in lmsysorg/sglang images
BIND_ALL = "0.0.0.0"  # noqa: S104 - a pod's server must be reachable on the pod's address


def k8s_word(word: str) -> str:
    return word.replace("$", "$$")


def engine_args(unit: Unit, port: int | None = None) -> list[str]:
    """``args`` of an SGLang engine's container (``command`` is ``python3``); ``port``: the one a
    discovering router reaches it on, instead of the planned one."""
    args = [k8s_word(w) for w in unit.argv[1:]]
    _set(args, "--host", BIND_ALL)
    if port is not None:
        _set(args, "--port", str(port))
    if unit.group is not None:
        store = unit.group.dist_init.rsplit(":", 1)[1]
        _set(args, "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{store}")
        _set(args, "--nnodes", "$(LWS_GROUP_SIZE)")
        _set(args, "--node-rank", "$(LWS_WORKER_INDEX)")
    return args


def router_args(unit: Unit, urls: dict[str, str]) -> tuple[list[str], list[str]]:
    """``args`` of a router's container with each upstream URL replaced by its in-cluster URL.

    ``urls`` maps a planned upstream URL (``http://<host address>:<port>``) to its Kubernetes one.
    Returns the args and the planned upstream URLs that have no Kubernetes URL (none expected).
    """
    args: list[str] = []
    missing: list[str] = []
    words = list(unit.argv[1:])
    for i, word in enumerate(words):
        if i and words[i - 1] in ("--prefill", "--decode", "--worker-urls"):
            if word in urls:
                args.append(urls[word])
                continue
            missing.append(word)
        args.append(k8s_word(word))
    _set(args, "--host", BIND_ALL)
    return args, missing


def _set(args: list[str], flag: str, value: str) -> None:
    """Replace the value of the plan's own ``flag`` (its first occurrence: settings and extra_args
    come after the words the plan places itself)."""
    at = args.index(flag)
    args[at + 1] = value
