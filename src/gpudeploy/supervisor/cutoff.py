"""When a watched host counts as cut off: its polls have gone unanswered for a while, not once.

A single state poll that takes longer than its timeout is not a lost host. On a machine whose
cores are all busy (two real SGLang engines starting beside the running pair, and a test suite,
on two cores) `systemctl show` over ssh once took over 5 s to answer, and the gate reported
"lost the connection" for a run that was starting fine. A host whose link is really down answers
no poll at all, so it is still found, a few polls later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CUT_OFF_S = 20.0  # no poll answered for this long: the host is cut off


class CutOff:
    """Tracks the last answered poll; ``failed()`` says whether the host is now cut off."""

    def __init__(self, after_s: float = CUT_OFF_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self.clock = clock
        self.last = clock()

    def answered(self) -> None:
        self.last = self.clock()

    def failed(self) -> bool:
        """One poll went unanswered: True once none has been answered for ``after_s``."""
        return self.clock() - self.last >= self.after_s
