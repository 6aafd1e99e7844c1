"""Errors that the CLI prints as one readable line (no traceback)."""


class BTBError(Exception):
    """Base class for user-facing errors (bad input, bad config)."""


class TraceError(BTBError, ValueError):
    """A trace file or table is malformed; the message names file, line/row, field and value."""


class ConfigError(BTBError, ValueError):
    """A spec or cluster config is invalid; the message names the field and the value."""
