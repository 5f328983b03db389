"""The Kafka messages the listener serves, as typed classes: one module per API family (`produce`,
`fetch`, `offsets`, `metadata`, `groups`, `admin`, `configs`, `sasl`, `transactions`,
`consumer_protocol`, `share`), written from Kafka's JSON specs by tools/kafka_messages.py;
`declare` is what each class tells the codec."""
