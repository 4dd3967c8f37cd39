"""One guarded request: the handler, its flow, and the performer of the exchange's commands."""
