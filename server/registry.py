"""A topic's subscriptions by name, also indexed by kind, so appends cost O(1) in subscriptions.

An append hands each batch to the subscriptions that see it as it passes: the non-reliable ones
(`live`, which keep nothing and must be offered the batch) and the last-value views (`views`).
Reliable subscriptions read the WAL at their own pace and are woken through the topic's
`AppendSignal`, so the append path never iterates them: with a thousand reliable subscriptions
and no live one, an append touches none.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

from server.lastvalue import LastValueSubscription
from server.subscription import Subscription

if TYPE_CHECKING:
    from server.reliable import ReliableSubscription


class SubscriptionRegistry(
    MutableMapping[str, "Subscription | ReliableSubscription | LastValueSubscription"]
):
    def __init__(self) -> None:
        self._all: dict[str, Subscription | ReliableSubscription | LastValueSubscription] = {}
        self.live: dict[str, Subscription] = {}
        self.views: dict[str, LastValueSubscription] = {}

    def __getitem__(self, name: str) -> Subscription | ReliableSubscription | LastValueSubscription:
        return self._all[name]

    def __setitem__(
        self, name: str, subscription: Subscription | ReliableSubscription | LastValueSubscription
    ) -> None:
        self._unindex(name)
        self._all[name] = subscription
        if isinstance(subscription, Subscription):
            self.live[name] = subscription
        elif isinstance(subscription, LastValueSubscription):
            self.views[name] = subscription

    def __delitem__(self, name: str) -> None:
        del self._all[name]
        self._unindex(name)

    def _unindex(self, name: str) -> None:
        self.live.pop(name, None)
        self.views.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def clear(self) -> None:
        self._all.clear()
        self.live.clear()
        self.views.clear()
