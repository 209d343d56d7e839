"""A pause of this process (SIGSTOP, a starved CPU) is not its peers' silence.

A service judges a peer dead by how long it has not heard from it. While the service itself was not
running, its peers' heartbeats queued up unread; the first timer check after it wakes would take
them all for dead. Each service loop notes the time once per turn, just before its timers: a turn
that took much longer than its poll may wait means the process was paused (wherever it stopped), and
silence is then counted from the end of that pause.
"""

from __future__ import annotations

PAUSE_SLACK_S = 1.0  # a loop's turn this much longer than its poll's timeout: the process did not run


class AwakeSince:
    def __init__(self) -> None:
        self.at = 0.0  # the end of the last pause noticed
        self._last_turn: float | None = None

    def turn(self, now: float, poll_timeout_s: float) -> None:
        """The loop's once-per-turn note, before its timers run; `poll_timeout_s`: the longest its
        poll may wait."""
        if self._last_turn is not None and now - self._last_turn > poll_timeout_s + PAUSE_SLACK_S:
            self.at = now
        self._last_turn = now

    def silence(self, now: float, last_heard: float) -> float:
        """How long a peer has been silent while this process was running to hear it."""
        return now - max(last_heard, self.at)
