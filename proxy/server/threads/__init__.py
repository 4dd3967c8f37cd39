"""Where work runs: on the loop or in threads, shared fairly per client, the collector kept off large
bodies."""
