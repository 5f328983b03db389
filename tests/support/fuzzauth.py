"""The state-machine test with authentication on (test_state_machine_with_auth).

The server runs with `--auth-tokens`; connections 0 and 2 authenticate as "alpha" (all:a*), 1 as
"beta" (all:b*), 3 as the hostile "mallory" (all:h*, produce:b0), and a fifth connection as an admin
(all:*) that only does the checks (listing, read-back, map get). Every connection sends every kind
of request to every topic; mallory also sends SEEK, DESCRIBE, LIST_TOPICS and flow/ack/unsubscribe
on other connections' consumer ids. On top of every invariant of the plain run, the model
(tests/support/fuzzmodel.py) expects NOT_AUTHORIZED, and no effect, for each request its principal
has no grant for, so nothing is written or deleted outside a principal's grants (the model of the
others' data stays exact); each connection is pushed only for its own consumers, whose subscribes
needed `consume`; and after every round each connection's LIST_TOPICS shows exactly the live topics
it has a grant on.
"""

from __future__ import annotations

from hypothesis.stateful import rule

from headwater.server.security.tokens import create
from headwater.wire import messages as m
from tests.support.fuzzmodel import Violation, show
from tests.support.fuzzops import AUTH_PRINCIPALS, AUTH_TOPICS, Op, auth_rounds, visible
from tests.test_statemachine import HeadwaterMachine


class AuthMachine(HeadwaterMachine):
    topics = AUTH_TOPICS
    check_conn = len(AUTH_PRINCIPALS)
    connections = len(AUTH_PRINCIPALS) + 1

    def _server_args(self) -> tuple[str, ...]:
        path = self.dir / "tokens.json"
        made: dict[str, str] = {}
        for principal, grants in (*AUTH_PRINCIPALS, ("checker", ("all:*",))):
            if principal not in made:
                _, token = create(path, principal, grants)
                assert token is not None
                made[principal] = token
        self.tokens = [made[p] for p, _ in AUTH_PRINCIPALS] + [made["checker"]]
        return ("--auth-tokens", str(path))

    def _grants(self) -> tuple[tuple[str, ...], ...]:
        return (*(g for _, g in AUTH_PRINCIPALS), ("all:*",))

    @rule(ops=auth_rounds())
    def pipeline(self, ops: list[Op], trickle: float | None = None) -> None:  # type: ignore[override]
        super().pipeline(ops, None)

    async def _after_round(self) -> None:
        await super()._after_round()
        await self._check_listings()

    async def _check_listings(self) -> None:
        """Each principal's LIST_TOPICS shows exactly the topics it has a grant on."""
        everything = {t for t in await self._listing()}
        for index, (principal, grants) in enumerate(AUTH_PRINCIPALS):
            outcome = await self._call(index, m.ListTopicsRequest(), f"LIST_TOPICS as {principal}")
            if not isinstance(outcome, m.ListTopicsResponse):
                raise Violation(f"LIST_TOPICS as {principal} answered {show(outcome)}")
            shown = {t.name for t in outcome.topics}
            wanted = {t for t in everything if visible(grants, t)}
            if shown != wanted:
                raise Violation(
                    f"LIST_TOPICS as {principal} ({', '.join(grants)}) shows {sorted(shown)}; "
                    f"it has grants on {sorted(wanted)} of {sorted(everything)}"
                )
