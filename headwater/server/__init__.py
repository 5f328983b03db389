"""The asyncio server: listener and connections, topics and partitions, subscriptions and
dispatch, configuration, logging. `server.serve` is the composition root; nothing imports this
package except the `headwater serve` command."""
