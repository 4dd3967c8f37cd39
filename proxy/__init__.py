"""context-guard: fits every chat-shaped LLM request to its model's context window."""

# The package's version, the one source of it (pyproject.toml reads it from here): a process
# knows its own without `importlib.metadata`, which costs about 50 ms of every start.
__version__ = "0.1.0"


def package_version() -> str:
    return __version__
