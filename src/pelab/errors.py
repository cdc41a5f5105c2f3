"""Errors that carry a message for the user: printed as one line (`Error: ...`), never a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key to change and how."""
