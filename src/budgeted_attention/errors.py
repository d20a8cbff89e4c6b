"""Exception types. All derive from ValueError so callers can catch bad input in one place;
the CLI turns them into one line on stderr and exit code 2."""


class BAAError(ValueError):
    """Base class for every user-facing error of this library."""


class ConfigError(BAAError):
    """A configuration file or value is invalid (names the key and the value)."""


class DataError(BAAError):
    """A data set cannot be found or holds malformed rows."""


class CheckpointError(BAAError):
    """A checkpoint file is missing, truncated, corrupted or does not match its metadata."""


class BudgetError(BAAError):
    """A budget is not a finite number in (0, 1] (names the value)."""
