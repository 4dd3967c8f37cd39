"""Where work runs: on the loop or in threads, shared fairly per client (and who a client is), the
collector kept off large bodies."""
