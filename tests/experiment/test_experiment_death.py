"""What a variant that dies under load is recorded with: the cause in the engine's own last lines."""

from __future__ import annotations

from gpudeploy.verify.causes import classify

# The SGLang stand-in's crash (crash-after-ready, crash-after-requests), as SGLang prints a scheduler
# exception: the launcher's "Received sigquit" comes after it.
CRASH = """\
[2026-12-01 10:43:44 TP0] The server is fired up and ready to roll!
[2026-12-01 10:43:50 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 3070, in run_scheduler_process
    scheduler.event_loop_overlap()
torch.AcceleratorError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[2026-12-01 10:43:50] Received sigquit from a child process. It usually means the child failed.
""".splitlines()


def test_a_scheduler_that_dies_serving_is_named_not_a_silent_exit() -> None:
    cause = classify(CRASH, {"max_running_requests": 128}, exited=True, exit_status="status=1")
    assert cause is not None and cause.kind == "cuda-illegal-memory-access", cause
    assert "while it ran requests" in cause.summary
    assert "CUDA_LAUNCH_BLOCKING=1" in cause.next_step and "(now 128)" in cause.next_step
    assert any("illegal memory access" in e for e in cause.evidence)
