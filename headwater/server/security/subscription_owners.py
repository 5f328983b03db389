"""Who created each reliable subscription, so that only its owner (or an admin) may seek it,
delete it or attach consumers to it.

The owner is the principal whose SUBSCRIBE first succeeded on a subscription with no owner
recorded (a subscription created before authentication was turned on goes to its first
authenticated subscriber). Deleting the subscription or its topic forgets the owner. Kept in
`<data_dir>/subscription-owners.json`, rewritten atomically on each change: subscriptions are
created rarely, and an owner must survive a restart, or anyone could claim a subscription by
attaching first after one. Non-reliable subscriptions live only while consumers are attached
and have no owner.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


class Owners:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._owners: dict[tuple[str, str], str] = {}
        try:
            rows = json.loads(path.read_text())
            self._owners = {(str(t), str(s)): str(p) for t, s, p in rows}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            # Refusing to start would lock everyone out; an admin can still seek and delete.
            log.error("auth.owners_unreadable", path=str(path), error=str(exc))

    def owner(self, topic: str, subscription: str) -> str | None:
        return self._owners.get((topic, subscription))

    def claim(self, topic: str, subscription: str, principal: str) -> None:
        if (topic, subscription) not in self._owners:
            self._owners[topic, subscription] = principal
            self._save()

    def forget(self, topic: str, subscription: str) -> None:
        if self._owners.pop((topic, subscription), None) is not None:
            self._save()

    def forget_topic(self, topic: str) -> None:
        before = len(self._owners)
        self._owners = {k: v for k, v in self._owners.items() if k[0] != topic}
        if len(self._owners) != before:
            self._save()

    def _save(self) -> None:
        rows = [[t, s, p] for (t, s), p in sorted(self._owners.items())]
        temporary = self._path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(rows))
            os.replace(temporary, self._path)
        except OSError as exc:
            # The owner stays in memory for this run; logged, since it is lost on a restart.
            log.error("auth.owners_not_saved", path=str(self._path), error=str(exc))
            with contextlib.suppress(OSError):
                temporary.unlink()
