"""The guard without a model: the built-in echo upstream and `context-guard demo`."""
