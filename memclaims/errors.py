"""Errors that reach a user as one line, never as a traceback."""


class MemclaimsError(Exception):
    """Base class: the message is complete and names the culprit and what to do."""


class UsageError(MemclaimsError):
    """Bad input from the user: an unknown name, an invalid combination, a malformed value."""


class DataError(MemclaimsError):
    """A data directory or data file that does not hold what it should."""
