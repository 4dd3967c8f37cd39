"""What the operator sees: the record and its log line, metrics, the page of recent decisions, health."""
