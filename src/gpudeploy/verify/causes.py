"""Why a server failed to start, from its own log lines: a pure table of patterns -> cause + next step.

Patterns are SGLang's real texts (see the SGLang reference in shared/reference/sglang.md). The advice
names flags in the spelling of the host's release, with the values the role uses now.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FlagName = Callable[[str], str]


@dataclass(frozen=True)
class Cause:
    kind: str
    summary: str
    evidence: tuple[str, ...] = ()
    next_step: str = ""
    fatal: bool = True
    extra: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"cause: {self.summary}"]
        lines += [f"    | {e}" for e in self.evidence]
        if self.next_step:
            lines.append(f"next step: {self.next_step}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    summary: str
    advice: Callable[[dict[str, object], FlagName], str]


def _setting(settings: dict[str, object], name: str, default: str = "SGLang's default") -> str:
    value = settings.get(name)
    return default if value is None else str(value)


RULES: tuple[Rule, ...] = (
    Rule("oom-in-graph-capture", re.compile(r"Capture cuda graph failed: CUDA out of memory"),
         "CUDA out of memory while capturing CUDA graphs: the headroom left by --mem-fraction-static is too small",
         lambda s, f: (f"lower {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')}) by 0.05-0.10, "
                       f"or cap {f('cuda_graph_max_bs')} (now {_setting(s, 'cuda_graph_max_bs')}) at 16; "
                       "`invoke plan --suggest` computes values that fit")),
    Rule("kv-pool-empty", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
         "the KV cache pool came out empty: weights use (almost) all of the static memory budget",
         lambda s, f: (f"raise {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')}), "
                       "or use more GPUs (larger TP) or a smaller/quantized model")),
    Rule("mamba-state-does-not-fit", re.compile(r"Not enough GPU memory for hybrid \(mamba"),
         "the hybrid (mamba/linear-attention) state cache does not fit",
         lambda s, f: (f"lower {f('max_running_requests')} (now {_setting(s, 'max_running_requests')}), or use "
                       f"{f('mamba_scheduler_strategy')} no_buffer instead of extra_buffer")),
    Rule("weights-do-not-fit", re.compile(r"(torch\.)?OutOfMemoryError: CUDA out of memory"),
         "CUDA out of memory before the server was up (the weights or activations do not fit)",
         lambda s, f: "use more GPUs (larger TP), a quantized checkpoint, or free the GPUs of other processes"),
    Rule("unknown-flag", re.compile(r"error: (unrecognized arguments|argument [^:]+: invalid choice)"),
         "the engine rejected its command line (a flag or value this release does not have)",
         lambda s, f: "check the engine_versions of the host against the SGLang actually installed there"),
    Rule("port-in-use", re.compile(r"(Address already in use|address already in use|Errno 98)"),
         "a port the server needs is already taken on the host",
         lambda s, f: "find who holds it (`ss -ltnp`) or give the role other ports under ports:"),
    Rule("nccl-error", re.compile(r"(NCCL error|DistBackendError|ncclUnhandledCudaError|NCCL WARN)"),
         "NCCL failed between the TP workers",
         lambda s, f: "check the GPUs' health and NCCL_* settings (NCCL_DEBUG=INFO in the role's env shows more)"),
    Rule("worker-died", re.compile(r"(Rank \d+ scheduler is dead|Child process unexpectedly failed|"
                                   r"scheduler is dead|Initialization failed\. warmup error)"),
         "a TP worker (scheduler) process died, so the server shut itself down",
         lambda s, f: "read the worker's own lines above; `invoke logs` shows the whole run"),
    Rule("unbalanced-memory", re.compile(r"The memory capacity is unbalanced"),
         "the GPUs of this server have different free memory: other processes are using some of them",
         lambda s, f: "`invoke status` lists GPU processes that belong to no unit; stop them first"),
)

PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Load weight begin")),
    ("allocating KV cache", re.compile(r"(Load weight end|KV Cache is allocated)")),
    ("capturing CUDA graphs", re.compile(r"Capture cuda graph begin")),
    ("starting HTTP server", re.compile(r"(Capture cuda graph end|max_total_num_tokens=)")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
)


def phase_of(line: str) -> str | None:
    for name, pattern in PHASES:
        if pattern.search(line):
            return name
    return None


def fatal_rule(line: str) -> Rule | None:
    for rule in RULES:
        if rule.pattern.search(line):
            return rule
    return None


def classify(lines: Sequence[str], settings: dict[str, object] | None = None,
             flag_name: FlagName | None = None, *, exited: bool = True, exit_status: str = "") -> Cause | None:
    """The first matching rule over the run's lines; or "exited without a message" when it died."""
    settings = settings or {}
    flag = flag_name or (lambda name: "--" + name.replace("_", "-"))
    for rule in RULES:
        for i, line in enumerate(lines):
            if rule.pattern.search(line):
                evidence = tuple(lines[max(0, i - 1): i + 4])
                return Cause(rule.kind, rule.summary, evidence, rule.advice(settings, flag))
    if exited:
        tail = tuple(lines[-5:])
        status = f" ({exit_status})" if exit_status else ""
        return Cause("exited-without-message", f"the server exited{status} without an error message",
                     tail, "run the same command by hand on the host (`invoke plan` shows it) or check "
                     "`dmesg` for the kernel's OOM killer")
    return None
