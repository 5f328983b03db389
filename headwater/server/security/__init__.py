"""Who may do what: `access` (authentication, the per-request checks, revocation), `authz` (which
action a request is and whether a principal's grants allow it), `tokens` (the tokens file), `tls`,
`quotas` (byte rates per principal) and `subscription_owners` (who may seek a subscription)."""
