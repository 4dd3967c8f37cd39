"""The documented memory bound (docs/security.md), asserted by the memory probe and by the deployment's limit."""

# The documented bound: peak RSS while a body is parsed and counted, over its bytes held.
PEAK_PER_BODY_MB = 3.0
PEAK_FIXED_MB = 16.0
