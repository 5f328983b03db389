"""A topic's subscriptions by name, also indexed by feed, so appends cost O(1) in subscriptions.

An append hands each batch to the subscriptions that see it as it passes: those fed batches
(`live`, which keep nothing and must be offered the batch) and those fed last-value changes
(`views`). Reliable subscriptions (fed nothing) read the WAL at their own pace and are woken
through the topic's `AppendSignal`, so the append path never iterates them: with a thousand
reliable subscriptions and no live one, an append touches none.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

from headwater.server.topics.subscription_contract import Feed, SubscriptionKind


class SubscriptionRegistry(MutableMapping[str, SubscriptionKind]):
    def __init__(self) -> None:
        self._all: dict[str, SubscriptionKind] = {}
        self.live: dict[str, SubscriptionKind] = {}
        self.views: dict[str, SubscriptionKind] = {}

    def __getitem__(self, name: str) -> SubscriptionKind:
        return self._all[name]

    def __setitem__(self, name: str, subscription: SubscriptionKind) -> None:
        self._unindex(name)
        self._all[name] = subscription
        if subscription.feed == Feed.BATCHES:
            self.live[name] = subscription
        elif subscription.feed == Feed.CHANGES:
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
