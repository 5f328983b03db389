"""Who may do what: `access` (authentication, the per-request checks, revocation), `authz` (which
action a request is and whether a principal's grants allow it), `tokens` (the tokens file), `tls`,
`quotas` (byte rates per principal), `subscription_owners` (who may seek a subscription) and
`pre_auth` (what an unauthenticated connection may send, from the frame header alone)."""
