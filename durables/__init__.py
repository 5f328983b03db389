"""Delivery state and semantics (cursors, acks, redelivery; standard, shared, last-value and map
durables). Empty until the reliable-dispatch and durables issues land; imports `wire` and
`storage`."""
