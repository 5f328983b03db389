"""The topic catalog: `topic_catalog` (every topic's files, state and lifecycle, and the
subscriptions, producer ids, dead letters and schemas loaded with them), `bounded` (opening and
closing thousands of topics a few at a time) and `housekeeping` (age-based rolling and local
retention, once a second). Imports `topics`, `subscriptions` and `schemas`."""
