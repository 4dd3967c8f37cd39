"""Tokenizers' vocabularies as the shell loads them (`proxy.tokenizers.vocabularies` dispatches to these modules)."""
