"""Tokenizers' vocabularies as the shell loads them (`proxy.encodings` dispatches to these modules)."""
