"""Verified JWTs remembered until they stop being valid, so that a client sending the same bearer token on
every call pays the signature check once (an ES256 verify is ~380 µs of a ~900 µs call: bench/README.md).

- Keyed by the SHA-256 of the whole token, signature included: a token differing in any byte (a forged
  signature, an edited claim) is another key and is verified in full. The token itself is never kept.
- Only successes are stored; a refused token is verified again on every call (a failure cached as a
  success would be a bypass; one cached as a failure would only save an attacker's CPU, not ours).
- An entry expires at the instant verification would start refusing the token: its `exp` plus the
  configured leeway, read from the caller's clock, so a token that expires while cached is refused from
  then on, exactly as an uncached one.
- Bounded (least recently used out): a flood of distinct valid tokens costs memory up to the bound only.
- It lives in its verifier: a reloaded key set (or auth file) makes a new verifier with an empty cache, so
  a token signed by a key that was removed is not accepted from memory.
"""

from __future__ import annotations

from collections import OrderedDict

from scheduler.auth.principal import Principal

MAX_ENTRIES = 10_000  # about 1 MiB: a principal and a float per entry


class VerifiedCache:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, digest: bytes, now: float) -> Principal | None:
        """The principal of a token verified earlier and still valid at `now` (seconds since the epoch)."""
        got = self._entries.get(digest)
        if got is None:
            self.misses += 1
            return None
        principal, until = got
        if now >= until:  # expired while cached: verified again, which refuses it
            del self._entries[digest]
            self.misses += 1
            return None
        self._entries.move_to_end(digest)
        self.hits += 1
        return principal

    def put(self, digest: bytes, principal: Principal, until: float) -> None:
        """Remember a token verified just now, valid until `until` (exclusive)."""
        self._entries[digest] = (principal, until)
        self._entries.move_to_end(digest)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
