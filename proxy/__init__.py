"""context-guard: fits every chat-shaped LLM request to its model's context window."""

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed package's version; `unknown` when run from a source tree never installed."""
    try:
        return version("context-guard")
    except PackageNotFoundError:
        return "unknown"
