"""The documented memory bound (docs/security.md), asserted by the memory probe and by the deployment's limit."""

# The documented bound: peak RSS while a body is parsed and counted, over its bytes held.
PEAK_PER_BODY_MB = 3.0
PEAK_FIXED_MB = 16.0

# The documented bound across requests: the guard's resident memory grows, at its peak, by at most
# this many times the bytes of request bodies it may hold at once (`server.body_memory_bytes`):
# each body's bytes, what they inflate to, its parse, its count and its forwarded copy. Measured
# at 6.3 (three 31 MiB bodies inflated from gzip uploads, parsed, counted and trimmed at once).
HELD_BYTES_FACTOR = 7.0
