"""The edge: what arrives, read once: the path and its route, the body within its limits, and the
credentials."""
