"""Connection admission on a server with authentication: how many connections may be waiting to
authenticate, in all and per source address.

Every connection starts unauthenticated and holds a slot of `max_connections` from its accept; an
anonymous peer opening sockets and sending nothing could otherwise hold every slot (10,000 silent
sockets from one address refused 39 of 58 legitimate connections). So the listener asks
`Admission.admit` before it takes a connection: past `max_unauthenticated_per_address` waiting
connections from that address, or `max_unauthenticated_connections` in all, the new one is
refused TOO_MANY_CONNECTIONS at once. The rest of `max_connections` is thereby kept for
authenticated connections, and a slot is held for at most `handshake_timeout`. A connection
leaves the count when AUTHENTICATE succeeds (`authenticated`) or when it closes (`release`).
"""

from __future__ import annotations

from headwater.wire.errors import TooManyConnections


class Admission:
    def __init__(self, total: int, per_address: int) -> None:
        self._total_cap = total
        self._per_address_cap = per_address
        self._by_address: dict[str, int] = {}
        self.waiting = 0  # connections counted now (for metrics and server info)

    def admit(self, address: str) -> TooManyConnections | None:
        """Count a new unauthenticated connection from `address`, or the error that refuses it."""
        held = self._by_address.get(address, 0)
        if held >= self._per_address_cap:
            return TooManyConnections(
                f"{held} connections from {address} are waiting to authenticate "
                f"(security.max_unauthenticated_per_address)"
            )
        if self.waiting >= self._total_cap:
            return TooManyConnections(
                f"{self.waiting} connections are waiting to authenticate "
                f"(security.max_unauthenticated_connections)"
            )
        self._by_address[address] = held + 1
        self.waiting += 1
        return None

    def release(self, address: str) -> None:
        """A counted connection authenticated or closed."""
        held = self._by_address.get(address, 0)
        if held <= 0:
            return
        if held == 1:
            del self._by_address[address]
        else:
            self._by_address[address] = held - 1
        self.waiting -= 1
