"""Delivery state and semantics, independent of I/O: `cursor` holds a reliable subscription's
acknowledgement state per partition (floor, out-of-order acks, delivery counts) and its encoding.
The standard, shared, last-value and map durables arrive with the durables issue. Imports `wire`
and `storage` only."""
