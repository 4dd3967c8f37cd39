"""Helpers the tests share: imported by test modules, never test modules themselves."""
