"""One execution's network record: every attempt, bounded in count and bytes.

A flood of attempts must not exhaust the gateway: past the caps, attempts are
only counted (`dropped`). A TCP SYN the kernel retransmits is one attempt.
"""

from __future__ import annotations

from backends.base import NetworkAttempt

MAX_ENTRIES = 256
MAX_BYTES = 64 * 1024
# Per-entry overhead counted against MAX_BYTES besides the host and detail text.
ENTRY_OVERHEAD = 64
MAX_HOST = 253
MAX_DETAIL = 200
# Keys remembered to fold retransmissions into one attempt.
MAX_SEEN = 4096


class NetworkRecord:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries: list[NetworkAttempt] = []
        self.bytes = 0
        self.dropped = 0
        self._seen: set[tuple[object, ...]] = set()

    def add(
        self,
        kind: str,
        host: str,
        port: int,
        verdict: str,
        rule: str,
        detail: str = "",
        key: tuple[object, ...] | None = None,
    ) -> None:
        if key is not None:
            if key in self._seen:
                return
            if len(self._seen) < MAX_SEEN:
                self._seen.add(key)
        host, detail = host[:MAX_HOST], detail[:MAX_DETAIL]
        size = ENTRY_OVERHEAD + len(host) + len(detail) + len(rule)
        if len(self.entries) >= self.max_entries or self.bytes + size > self.max_bytes:
            self.dropped += 1
            return
        self.bytes += size
        self.entries.append(
            NetworkAttempt(
                kind=kind, host=host, port=port, verdict=verdict, rule=rule, detail=detail
            )
        )
