"""Why a server failed to start, from its own log lines: a pure table of patterns -> cause + next step.

One table per engine log format (a role's ``log_format``): ``sglang`` (SGLang's real texts, see
shared/reference/sglang.md) and ``vllm`` (vLLM's real texts, from its source and from runs of its CPU
build in the lab). The advice names flags in the spelling of the host's release, with the values the
role uses now.

A CUDA out-of-memory error means what the phase it came in says (:mod:`gpudeploy.memory.logparse`
reads the phases): while the weights load, they do not fit; once they are loaded it is never that,
but the KV pool, the CUDA graphs (target decode or verify, draft, prefill), warmup's activations or
a request being served, each with its own fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..memory.logparse import parse_memory_log

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


# (the run's lines, the index of the matching line, the role's settings, the flag speller) ->
# (summary, next step): for a rule whose words depend on what the line says (the flag, the module).
Explain = Callable[[Sequence[str], int, dict[str, object], FlagName], tuple[str, str]]


@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    summary: str
    advice: Callable[[dict[str, object], FlagName], str]
    explain: Explain | None = None

    def words(self, lines: Sequence[str], i: int, settings: dict[str, object], flag: FlagName) -> tuple[str, str]:
        if self.explain is not None:
            return self.explain(lines, i, settings, flag)
        return self.summary, self.advice(settings, flag)


def _setting(settings: dict[str, object], name: str, default: str = "SGLang's default") -> str:
    value = settings.get(name)
    return default if value is None else str(value)


def _match(rule_pattern: re.Pattern[str], line: str) -> re.Match[str]:
    m = rule_pattern.search(line)
    assert m is not None  # only called for the line the rule matched
    return m


# uvicorn's words (both engines): "[Errno 98] error while attempting to bind on address ('127.0.0.1',
# 30000): address already in use" (real SGLang 0.5.23, tests/verify/data/sglang-0.5.23-cpu/port-in-use.log)
_BIND_ADDRESS = re.compile(r"bind on address \('([^']*)', (\d+)\)")


def _port_words(lines: Sequence[str], i: int, s: dict[str, object], f: FlagName) -> tuple[str, str]:
    summary = "a port the server needs is already taken on the host"
    where = "it"
    m = _BIND_ADDRESS.search(lines[i])
    if m:
        summary += f" (port {m.group(2)} on {m.group(1)})"
        where = f"port {m.group(2)}"
    return summary, f"find who holds {where} (`ss -ltnp`) or give the role other ports under ports:"


# Engine-independent: the kernel's words for a taken port are the same for every server.
PORT_IN_USE = Rule("port-in-use", re.compile(r"(Address already in use|address already in use|Errno 98)"),
                   "a port the server needs is already taken on the host",
                   lambda s, f: "find who holds it (`ss -ltnp`) or give the role other ports under ports:",
                   _port_words)

# argparse's last line: "sglang serve: error: unrecognized arguments: --no-such-flag 1", "...: error:
# argument --max-total-tokens: Invalid integer value: 'abc'. Use a plain integer, ..." (0.5.23's own
# type, srt/utils/common.py human_readable_int), "argument --port: invalid int value: 'x'" (argparse's)
_ARGPARSE_ERROR = re.compile(r"error: (.*)$")


def _argparse_words(what: str, advice: str) -> Explain:
    def words(lines: Sequence[str], i: int, s: dict[str, object], f: FlagName) -> tuple[str, str]:
        m = _ARGPARSE_ERROR.search(lines[i])
        said = m.group(1).strip() if m else ""
        return (f"{what}: {said}" if said else what), advice
    return words


def _missing_module_words(lines: Sequence[str], i: int, s: dict[str, object], f: FlagName) -> tuple[str, str]:
    m = _match(MISSING_MODULE, lines[i])
    module = (m.group(1) or m.group(2) or "?").split(".")[0]
    package = KNOWN_PACKAGES.get(module, f"the package that provides `{module}`")
    summary = f"the engine's Python lacks the module `{module}`, so a process could not start"
    step = f"install {package} into the engine's environment on the host (the role's python)"
    if module in TRANSFER_MODULES:
        backend = _setting(s, "disaggregation_transfer_backend", "mooncake (SGLang's default)")
        step += (f", or choose another {f('disaggregation_transfer_backend')} (now {backend}); SGLang needs it "
                 "for the KV transfer between prefill and decode")
    return summary, step


# ImportError's or ModuleNotFoundError's last line of a traceback, at the start of the line: a log
# message that only mentions a missing module ("Ignore import error when loading
# sglang.srt.models.inkling: No module named 'cutlass'", printed by every healthy 0.5.23 start) is not one.
MISSING_MODULE = re.compile(r"^(?:ImportError: Please install (\w[\w.-]*)"
                            r"|(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)')")
# What to install for the modules SGLang asks for (sglang-cpu.md; mooncake's own install page)
KNOWN_PACKAGES = {
    "mooncake": "mooncake (pip: mooncake-transfer-engine; on a host without CUDA, "
                "mooncake-transfer-engine-non-cuda)",
    "nixl": "nixl (pip: nixl)",
}
TRANSFER_MODULES = ("mooncake", "nixl")

# A model path that does not exist is taken for a hub repo id by transformers: for a local path
# SGLang 0.5.23 says "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name':
# '/nonexistent/tiny-model'. Use `repo_type` argument if needed." (missing-model.log); vLLM the same.
MODEL_NOT_FOUND = re.compile(r"(does not appear to have a file named|Invalid repository ID or local directory"
                             r"|Repo id must be|HFValidationError:|No such file or directory: '[^']*config\.json'"
                             r"|Can't load the configuration of|LocalEntryNotFoundError|OfflineModeIsEnabled)")
_QUOTED_PATH = re.compile(r"'(/[^']*)'")


def _model_words(engine: str) -> Explain:
    def words(lines: Sequence[str], i: int, s: dict[str, object], f: FlagName) -> tuple[str, str]:
        m = next((m for line in lines[i: i + 10] if (m := _QUOTED_PATH.search(line))), None)
        path = f" {m.group(1)}" if m else ""
        return (f"{engine} cannot find or read the model{path} (and may not download it: HF_HUB_OFFLINE=1)",
                "check the role's model path exists on the host with config.json, weights and tokenizer")
    return words


def _worker_words(lines: Sequence[str], i: int, s: dict[str, object], f: FlagName) -> tuple[str, str]:
    summary = "a TP worker (scheduler) process died, so the server shut itself down"
    step = "read the worker's own lines above; `invoke logs` shows the whole run"
    m = next((m for line in lines[i: i + 5] if (m := re.search(r"exit ?code(?:=|: | )(-?\d+)", line))), None)
    if m:
        code = int(m.group(1))
        summary += f" (its exit code {code}" + (": killed by SIGKILL)" if code == -9 else ")")
        if code == -9:
            step = ("it was killed (SIGKILL) without a word of its own: the kernel's OOM killer (`dmesg -T | grep -i "
                    "oom` on the host) or another process; `invoke logs` shows the whole run")
    return summary, step


# A traceback's last line: "RuntimeError: ...", "torch.AcceleratorError: ...", "KeyError: 'x'"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
_LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def _scheduler_exception_words(lines: Sequence[str], i: int, s: dict[str, object],
                               f: FlagName) -> tuple[str, str]:
    """The exception the scheduler's traceback ends with (the record runs until the next log record)."""
    last = ""
    for line in lines[i + 1: i + 400]:
        if _LOG_RECORD.match(line):
            break
        if _EXCEPTION_LINE.match(line.strip()):
            last = line.strip()
    said = f": {last[:300]}" if last else ""
    return (f"the scheduler raised an exception while it ran{said}",
            "the traceback above names where; `invoke logs` shows the whole run")

def _graph_advice(s: dict[str, object], f: FlagName) -> str:
    return (f"lower {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')}) or cap "
            f"{f('cuda_graph_max_bs')} (now {_setting(s, 'cuda_graph_max_bs')}) at 16; the next `invoke plan` "
            "reads this run's log and recommends values that cover what it was short (`--suggest` lists more)")


def _hybrid(s: dict[str, object]) -> bool:
    """The role runs a hybrid (mamba) model: it names a mamba setting."""
    return any(k in s for k in ("mamba_scheduler_strategy", "mamba_radix_cache_strategy", "max_mamba_cache_size",
                                "mamba_full_memory_ratio"))


def _kv_empty_advice(s: dict[str, object], f: FlagName) -> str:
    if _hybrid(s):
        strategy = _setting(s, "mamba_scheduler_strategy", _setting(s, "mamba_radix_cache_strategy", "auto"))
        spec = " and speculative decoding's intermediate states" if s.get("speculative_algorithm") else ""
        return (f"for a hybrid model the mamba state{spec} is taken before the KV pool is sized, so SGLang's "
                f"\"increase --mem-fraction-static\" rarely helps: lower {f('max_running_requests')} (now "
                f"{_setting(s, 'max_running_requests')}) or set {f('max_mamba_cache_size')}, and with "
                f"{f('mamba_scheduler_strategy')} {strategy} try no_buffer (extra_buffer keeps 2 more slots per "
                "request); `invoke plan` computes a combination that fits")
    if s.get("max_total_tokens") is not None:
        # 0.5.23 caps the pool at --max-total-tokens before it checks it: with 0 it says "Not enough
        # memory. Please try to increase --mem-fraction-static." whatever the fraction (kv-too-small.log)
        return (f"the pool is capped by {f('max_total_tokens')} (now {_setting(s, 'max_total_tokens')}): raise it or "
                f"leave it out; if it is not what limits the pool, raise {f('mem_fraction_static')} (now "
                f"{_setting(s, 'mem_fraction_static')})")
    return (f"raise {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')}), "
            "or use more GPUs (larger TP) or a smaller/quantized model")


RULES: tuple[Rule, ...] = (
    # 0.5.9: "Capture cuda graph failed: ..."; 0.5.23: the decode and draft runners print the same,
    # the prefill runner "Capture prefill CUDA graph failed: ..." (runner/*cuda_graph_runner.py)
    Rule("oom-in-graph-capture", re.compile(r"Capture (?:[\w-]+ )*cuda graph failed: CUDA out of memory", re.I),
         "CUDA out of memory while capturing CUDA graphs: the headroom left by --mem-fraction-static is too small",
         _graph_advice),
    Rule("kv-pool-empty", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"
                                     r"|Loaded weights leave no GPU memory for the KV cache"),
         "the KV cache pool came out empty: the static memory budget holds no KV cache",
         _kv_empty_advice),
    Rule("mamba-state-does-not-fit", re.compile(r"Not enough GPU memory for hybrid \(mamba"),
         "the hybrid (mamba/linear-attention) state cache does not fit",
         lambda s, f: (f"lower {f('max_running_requests')} (now {_setting(s, 'max_running_requests')}), or use "
                       f"{f('mamba_scheduler_strategy')} no_buffer instead of extra_buffer")),
    # torch's own text: what it means depends on the phase (see OOM_BY_PHASE below)
    Rule("cuda-oom", re.compile(r"(torch\.)?OutOfMemoryError: CUDA out of memory"
                                r"|CUDA out of memory\. Tried to allocate"),
         "CUDA out of memory (no startup phase in the log to say where)",
         lambda s, f: "the lines above say what was being allocated; `invoke logs` shows the whole run"),
    Rule("unknown-flag", re.compile(r"error: (unrecognized arguments|argument [^:]+: invalid choice)"),
         "the engine rejected its command line (a flag or value this release does not have)",
         lambda s, f: "check the engine_versions of the host against the SGLang actually installed there",
         _argparse_words("the engine rejected its command line (a flag or value this release does not have)",
                         "check the engine_versions of the host against the SGLang actually installed there")),
    # 0.5.23's own integer type (--max-total-tokens, --context-length, --max-prefill-tokens, ...) and
    # argparse's int/float types (invalid-value.log)
    Rule("invalid-flag-value", re.compile(r"error: argument [^:]+: (Invalid integer value|invalid \w+ value"
                                          r"|Decimals are not allowed)"),
         "the engine rejected the value of a flag",
         lambda s, f: "fix that value in the role's settings (`invoke plan` shows the command)",
         _argparse_words("the engine rejected the value of a flag",
                         "fix that value in the role's settings (`invoke plan` shows the command)")),
    # The lab's PD prefill without mooncake: "ImportError: Please install mooncake by following the
    # instructions at https://kvcache-ai.github.io/Mooncake/... to run SGLang with MooncakeTransferEngine."
    # from srt/distributed/device_communicators/mooncake_transfer_engine.py, after "ModuleNotFoundError:
    # No module named 'mooncake'"; then the launcher SIGKILLs itself (missing-module.log)
    Rule("missing-module", MISSING_MODULE, "the engine's Python lacks a module it needs",
         lambda s, f: "install it into the engine's environment on the host", _missing_module_words),
    Rule("model-not-found", MODEL_NOT_FOUND,
         "SGLang cannot find or read the model directory (and may not download it: HF_HUB_OFFLINE=1)",
         lambda s, f: "check the role's model path exists on the host with config.json, weights and tokenizer",
         _model_words("SGLang")),
    PORT_IN_USE,
    # A multi-node group's other node went away: its gloo (or NCCL) connections broke. Before the
    # generic rules: the launcher's "Received sigquit" follows it. The cause is that other rank's.
    Rule("peer-lost", re.compile(r"(Connection closed by peer|Connection reset by peer|ncclRemoteError"
                                 r"|remote process exited)"),
         "a rank on another node of this group went away (its connections to this node broke)",
         lambda s, f: "the group's first failure is the real cause: see the rank it names; `invoke status` "
                      "shows every rank"),
    # Not "NCCL WARN": NCCL_DEBUG=WARN/INFO (which the advice below suggests) prints harmless ones.
    Rule("nccl-error", re.compile(r"(NCCL error|DistBackendError|ncclUnhandledCudaError|ncclSystemError"
                                  r"|ncclInternalError|ncclInvalidUsage)"),
         "NCCL failed between the TP workers",
         lambda s, f: "check the GPUs' health and NCCL_* settings (NCCL_DEBUG=INFO in the role's env shows more)"),
    # A PD prefill whose KV transfer thread died: 0.5.23's mooncake transfer_worker turns any error into
    # "RuntimeError: Transfer thread failed because of <error>. Prefill instance with bootstrap_port=N is
    # dead." and ends, never restarted (disaggregation/mooncake/conn.py); the process and its /health live
    # on while every transfer queued to that thread hangs (sgl-project/sglang#27162 describes the stall).
    # Seen in a loaded lab run mid roll: "because of 658755885904621646", a KeyError of a room another
    # thread had just cleared (conn.py checks `room not in request_status`, then reads it).
    Rule("kv-transfer-thread-died", re.compile(r"Transfer thread failed because of .*Prefill instance with "
                                               r"bootstrap_port=\d+ is dead"),
         "the prefill's KV transfer thread died (SGLang's mooncake transfer_worker ends on its first error); "
         "the server still answers /health, but the requests whose KV that thread was to send now hang",
         lambda s, f: "restart this server (`invoke deploy` again, or teardown and deploy its role): nothing "
                      "restarts the thread; the error it names is above"),
    # A server that was serving and then died (under load, typically): the scheduler's own exception.
    # Before worker-died: the launcher's "Received sigquit from a child process" follows it.
    Rule("cuda-illegal-memory-access", re.compile(r"CUDA error: an illegal memory access was encountered"),
         "a CUDA illegal memory access in the scheduler while it ran requests, so the server exited",
         lambda s, f: (f"a kernel failed at this load: rerun with CUDA_LAUNCH_BLOCKING=1 in the role's env to name "
                       f"it; lowering {f('max_running_requests')} (now {_setting(s, 'max_running_requests')}) or "
                       f"{f('cuda_graph_max_bs')} avoids the batch sizes that hit it")),
    Rule("unbalanced-memory", re.compile(r"The memory capacity is unbalanced"),
         "the GPUs of this server have different free memory: other processes are using some of them",
         lambda s, f: "`invoke status` lists GPU processes that belong to no unit; stop them first"),
    # Any other exception of a scheduler (0.5.23 scheduler.py run_scheduler_process: "Scheduler hit an
    # exception: <traceback>", then SIGQUIT to the launcher): after the specific rules above, whose texts
    # come inside such a traceback, and before the launcher's words about the death that follows.
    Rule("scheduler-exception", re.compile(r"Scheduler hit an exception"),
         "the scheduler raised an exception while it ran",
         lambda s, f: "the traceback above names where; `invoke logs` shows the whole run",
         _scheduler_exception_words),
    # A scheduler that died without a word (SIGKILL): 0.5.9 "Rank N scheduler is dead", "Child process
    # unexpectedly failed with exitcode=-9"; 0.5.23 before ready "RuntimeError: Rank 0 scheduler died
    # during initialization (exit code: -9). ..." (engine.py _scheduler_died_error), after ready the
    # watchdog's "Subprocess scheduler_0 (pid=N) crashed with exit code -9. Triggering SIGQUIT for
    # cleanup..." (utils/watchdog.py); then the launcher's SIGQUIT words, in the launch phase "Received
    # sigquit from a child process. It usually means the child failed.", once serving "SIGQUIT received.
    # signum=None, frame=None. It usually means one child failed." (scheduler-killed-*.log)
    Rule("worker-died", re.compile(r"(Rank \d+ scheduler is dead|Child process unexpectedly failed|"
                                   r"scheduler is dead|Initialization failed\. warmup error"
                                   r"|scheduler died during initialization|Subprocess scheduler_\d+ \(pid=\d+\) crashed"
                                   r"|Received sigquit from a child process|It usually means one child failed)"),
         "a TP worker (scheduler) process died, so the server shut itself down",
         lambda s, f: "read the worker's own lines above; `invoke logs` shows the whole run",
         _worker_words),
)

# What a CUDA OOM means, by the phase it came in (memory.logparse's OOM_MEANS): cause, summary, advice.
OOM_BY_PHASE: dict[str, tuple[str, str, Callable[[dict[str, object], FlagName], str]]] = {
    "weights-do-not-fit": ("weights-do-not-fit", "CUDA out of memory while loading the weights: they do not fit",
                           lambda s, f: "use more GPUs (larger TP), a quantized checkpoint, or free the GPUs of "
                                        "other processes"),
    "memory-pool-does-not-fit": (
        "memory-pool-does-not-fit",
        "CUDA out of memory after the weights loaded, while the KV pool and request table were allocated",
        lambda s, f: (f"less was free than SGLang measured (another process, or a driver that hides memory, as WSL2 "
                      f"does): lower {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')}) or "
                      f"{f('max_running_requests')} / {f('context_length')}; `invoke status` lists GPU processes "
                      "that belong to no unit")),
    "oom-in-graph-capture": ("oom-in-graph-capture",
                             "CUDA out of memory after the weights loaded, while capturing CUDA graphs: the headroom "
                             "left by --mem-fraction-static is too small", _graph_advice),
    "oom-at-warmup": ("oom-at-warmup", "CUDA out of memory in warmup, after every CUDA graph was captured: the "
                      "prefill activations do not fit in the headroom",
                      lambda s, f: (f"lower {f('chunked_prefill_size')} (now {_setting(s, 'chunked_prefill_size')}) "
                                    f"or {f('mem_fraction_static')} (now {_setting(s, 'mem_fraction_static')})")),
    "oom-while-serving": ("oom-while-serving", "CUDA out of memory while serving requests",
                          lambda s, f: (f"lower {f('chunked_prefill_size')} (now "
                                        f"{_setting(s, 'chunked_prefill_size')}), {f('max_running_requests')} "
                                        f"(now {_setting(s, 'max_running_requests')}) or "
                                        f"{f('mem_fraction_static')}")),
}

# The gate's phases (verify/gate.py's PHASE_ORDER). A capture's "end" line moves no phase: 0.5.23
# captures prefill graphs before decode ones, and a speculative run loads and captures its draft
# after the target's graphs; the scheduler's summary line comes after all of them.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Load weight begin")),
    ("allocating KV cache", re.compile(r"(Load weight end|KV Cache is allocated)")),
    # 0.5.9 "Capture cuda graph begin", "Capture draft cuda graph begin"; 0.5.23 "Capture target
    # decode|verify|prefill CUDA graph begin", "Capture draft decode|extend CUDA graph begin"
    ("capturing CUDA graphs", re.compile(r"Capture (?:[\w-]+ )*(?:cuda|CUDA) graph begin"
                                         r"|Capture piecewise CUDA graph")),
    ("starting HTTP server", re.compile(r"max_total_num_tokens=\d+, chunked_prefill_size=")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
)



def _vllm(settings: dict[str, object], name: str) -> str:
    return _setting(settings, name, "vLLM's default")


# vLLM's own startup errors (vLLM 0.32, CPU build). Order matters: the first rule that matches any line
# wins, so the specific causes come before "the engine core died", which vLLM prints after every one.
VLLM_RULES: tuple[Rule, ...] = (
    Rule("unknown-flag", re.compile(r"error: (unrecognized arguments|argument [^:]+: (invalid|expected))"),
         "vLLM rejected its command line (a flag or value this release does not have)",
         lambda s, f: "fix the role's argv/settings: `python -m vllm.entrypoints.openai.api_server --help` "
                      "on the host lists what the installed vLLM accepts"),
    Rule("kv-cache-too-large",
         # cpu_worker.py: "Available memory on node 0 (x/y GiB) on kv cache allocation is less than
         # requested memory for kv (z GiB). Decrease --kv-cache-memory-bytes, ..."
         re.compile(r"(allocation is less than requested memory for kv|Cannot allocate memory)"),
         "the KV cache asked for does not fit in the memory the host has free",
         lambda s, f: (f"lower {f('kv_cache_memory_bytes')} (now {_vllm(s, 'kv_cache_memory_bytes')}) "
                       "or free memory on the host (`free -g`); on CPU the KV cache lives in host RAM")),
    Rule("kv-cache-too-small",
         re.compile(r"(KV cache is needed, which is larger than the available KV cache memory"
                    r"|No available memory for the cache blocks)"),
         "the KV cache is too small for even one request of --max-model-len tokens",
         lambda s, f: (f"raise {f('kv_cache_memory_bytes')} (now {_vllm(s, 'kv_cache_memory_bytes')}) or lower "
                       f"{f('max_model_len')} (now {_vllm(s, 'max_model_len')}); vLLM's message above "
                       "gives the largest length that fits")),
    Rule("max-model-len-too-long", re.compile(r"User-specified max_model_len \(\d+\) is greater than"),
         "--max-model-len is longer than the model's own context length",
         lambda s, f: (f"lower {f('max_model_len')} (now {_vllm(s, 'max_model_len')}) to the model's "
                       "max_position_embeddings")),
    Rule("model-not-found", MODEL_NOT_FOUND,
         "vLLM cannot find or read the model directory (and may not download it: HF_HUB_OFFLINE=1)",
         lambda s, f: "check the role's model path exists on the host with config.json, weights and tokenizer",
         _model_words("vLLM")),
    Rule("unsupported-attention", re.compile(r"Unsupported CPU attention configuration"),
         "the CPU attention backend does not support this model's shape (head_dim must be >= 32)",
         lambda s, f: "use a model with a larger head_dim (hidden_size / num_attention_heads)"),
    PORT_IN_USE,
    Rule("out-of-memory", re.compile(r"(torch\.OutOfMemoryError|MemoryError|Killed process \d+)"),
         "the host ran out of memory while vLLM started",
         lambda s, f: (f"lower {f('kv_cache_memory_bytes')} (now {_vllm(s, 'kv_cache_memory_bytes')}) "
                       f"or {f('max_model_len')}, or free memory on the host")),
    Rule("engine-core-died",
         re.compile(r"(Engine core initialization failed|EngineCore failed to start|"
                    r"Worker proc \S+ died unexpectedly|WorkerProc initialization failed|EngineDeadError)"),
         "vLLM's engine core (or its worker) died while starting, so the API server gave up",
         lambda s, f: "read the EngineCore/Worker lines above; `invoke logs` shows the whole run"),
)

VLLM_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"(Starting to load model|Loading weights)")),
    ("allocating KV cache", re.compile(r"(Model loading took|Loading weights took|KV cache)")),
    ("capturing CUDA graphs", re.compile(r"Capturing CUDA graph")),
    ("starting HTTP server", re.compile(r"(init engine \(profile, create kv cache, warmup model\) took"
                                        r"|Starting vLLM (API )?server)")),
    ("ready", re.compile(r"Application startup complete")),
)


@dataclass(frozen=True)
class LogFormat:
    """How one engine family logs: its fatal texts and its startup phases."""

    name: str
    rules: tuple[Rule, ...]
    phases: tuple[tuple[str, re.Pattern[str]], ...]
    journal_lines: int = 60  # how much of a failed run's journal status reads to find the cause


SGLANG = LogFormat("sglang", RULES, PHASES)
# vLLM prints each error as a traceback from three processes (Worker, EngineCore, APIServer), a few
# hundred lines in all; the specific cause comes first, "Engine core initialization failed" last.
VLLM = LogFormat("vllm", VLLM_RULES, VLLM_PHASES, journal_lines=600)
LOG_FORMATS = {f.name: f for f in (SGLANG, VLLM)}


def log_format(name: str | None) -> LogFormat:
    """The table for a role's ``log_format`` (SGLang's when unset or unknown)."""
    return LOG_FORMATS.get(name or "sglang", SGLANG)


def _oom_cause(lines: Sequence[str], settings: dict[str, object], flag: FlagName,
               evidence: tuple[str, ...]) -> Cause:
    """A torch OOM, named by the phase the run was in when it came."""
    m = parse_memory_log(lines)
    rule = next(r for r in RULES if r.kind == "cuda-oom")
    kind, summary, advice = OOM_BY_PHASE.get(m.failure or "", (rule.kind, rule.summary, rule.advice))
    if m.shortfall_gib is not None:
        summary += (f" ({m.shortfall_gib:.2f} GiB short: it asked for {m.oom_tried_gib:.2f} GiB with "
                    f"{m.oom_free_gib or 0:.2f} GiB free" + (f" on GPU {m.oom_gpu}" if m.oom_gpu is not None else "")
                    + ")")
    extra = {"phase": m.oom_phase or m.phase_reached}
    return Cause(kind, summary, evidence, advice(settings, flag), extra=extra)


def phase_of(line: str, fmt: LogFormat = SGLANG) -> str | None:
    for name, pattern in fmt.phases:
        if pattern.search(line):
            return name
    return None


def fatal_rule(line: str, fmt: LogFormat = SGLANG) -> Rule | None:
    for rule in fmt.rules:
        if rule.pattern.search(line):
            return rule
    return None


def classify(lines: Sequence[str], settings: dict[str, object] | None = None,
             flag_name: FlagName | None = None, *, exited: bool = True, exit_status: str = "",
             fmt: LogFormat = SGLANG) -> Cause | None:
    """The first matching rule over the run's lines; or "exited without a message" when it died."""
    settings = settings or {}
    flag = flag_name or (lambda name: "--" + name.replace("_", "-"))
    for rule in fmt.rules:
        for i, line in enumerate(lines):
            if rule.pattern.search(line):
                evidence = tuple(lines[max(0, i - 1): i + 4])
                if rule.kind == "cuda-oom":
                    return _oom_cause(lines, settings, flag, evidence)
                summary, step = rule.words(lines, i, settings, flag)
                return Cause(rule.kind, summary, evidence, step)
    if exited:
        tail = tuple(lines[-5:])
        status = f" ({exit_status})" if exit_status else ""
        return Cause("exited-without-message", f"the server exited{status} without an error message",
                     tail, "run the same command by hand on the host (`invoke plan` shows it) or check "
                     "`dmesg` for the kernel's OOM killer")
    return None
