"""Which stop sequence ended the answer (Anthropic names it in `stop_sequence`).

The scheduler is asked to keep the matched stop string in the output (include_stop_str_in_output);
this holds back as many characters as the longest stop sequence could take, and at the end cuts the
one the output ends with and names it. Streamed or not, the client never sees the stop sequence.
"""

from __future__ import annotations


class StopCutter:
    def __init__(self, stops: list[str] | None) -> None:
        self.stops = stops or []
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        self._held += text
        keep = max(len(s) for s in self.stops)
        out, self._held = self._held[:-keep], self._held[-keep:]
        return out

    def finish(self, stopped: bool) -> str:
        """`stopped`: the output ended on a stop condition (not a length limit)."""
        rest, self._held = self._held, ""
        if stopped:
            for s in sorted(self.stops, key=len, reverse=True):
                if rest.endswith(s):
                    self.matched = s
                    return rest[: -len(s)]
        return rest
