"""Anthropic Messages as the core's chat view: blocks, tools and the error shape."""
