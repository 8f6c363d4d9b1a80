"""A watched host is cut off when its polls go unanswered for a while, not when one poll is slow.

Loaded run 6 of the suite (both cores busy) failed a rolling update: one `systemctl show` took over
5 s while two real engines started, and the gate said "lost the connection to lab1" for a surge
run that was starting fine.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpudeploy.errors import HostUnreachable, RemoteError
from gpudeploy.remote.base import Result
from gpudeploy.supervisor.base import Run
from gpudeploy.supervisor.cutoff import CutOff
from gpudeploy.supervisor.process import ProcessWatch
from gpudeploy.supervisor.systemd import Watch

RUN = Run("gd-x.service", "inv1", 100, 0, False)


class Sink:
    def __init__(self) -> None:
        self.lost_reasons: list[str] = []

    def line(self, text: str) -> None: ...

    def exited(self, words: str, *, from_log: bool) -> None: ...

    def lost(self, reason: str) -> None:
        self.lost_reasons.append(reason)


class Host:
    """Answers its polls as told: ``answers`` is a list of exceptions or None (answered)."""

    def __init__(self, answers: list[BaseException | None], done: threading.Event) -> None:
        self.answers = answers
        self.done = done
        self.polls = 0

    def run(self, argv: list[str], **kw: Any) -> Result:
        self.polls += 1
        if not self.answers:
            self.done.set()  # the gate ended
            return Result(0, "", "")
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return Result(0, "", "")


def _watches(host: Host, sink: Sink, cut_off: CutOff) -> list[Any]:
    return [Watch(host, [RUN], {RUN.unit: sink}, poll_s=0.01, cut_off=cut_off),  # type: ignore[arg-type]
            ProcessWatch(host, [RUN], {RUN.unit: sink}, "python3", poll_s=0.01,  # type: ignore[arg-type]
                         cut_off=cut_off)]


@pytest.mark.parametrize("which", [0, 1], ids=["systemd", "process"])
def test_a_slow_poll_or_two_is_not_a_lost_host(which: int) -> None:
    slow = RemoteError("lab1", "`systemctl show ...` did not finish within 5 s")
    sink = Sink()
    done = threading.Event()
    host = Host([slow, slow, None, slow, None], done)
    watch = _watches(host, sink, CutOff(after_s=60.0))[which]
    watch.done = done
    watch._poll()
    assert sink.lost_reasons == [] and host.polls == 6


@pytest.mark.parametrize("which", [0, 1], ids=["systemd", "process"])
def test_a_host_that_answers_no_poll_is_lost_with_the_reason(which: int) -> None:
    now = [0.0]
    cut_off = CutOff(after_s=20.0, clock=lambda: now[0])

    class Silent(Host):
        def run(self, argv: list[str], **kw: Any) -> Result:
            self.polls += 1
            now[0] += 5.0  # each poll waits its whole timeout
            raise HostUnreachable("lab1", "the ssh connection was lost: Timeout opening channel.")

    sink = Sink()
    done = threading.Event()
    host = Silent([], done)
    watch = _watches(host, sink, cut_off)[which]
    watch.done = done
    watch._poll()
    assert host.polls == 4  # 20 s of unanswered polls, not the first one
    assert sink.lost_reasons == ["lab1: the ssh connection was lost: Timeout opening channel."]
