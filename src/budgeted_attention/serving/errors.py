"""What can go wrong with the server's engine, as exception types of their own (no model imports,
so the HTTP layer can catch them without loading torch)."""

from __future__ import annotations


class EngineProcessError(RuntimeError):
    """The engine process failed to start, failed a call, or is gone."""


class EngineGone(EngineProcessError):
    """The engine process exited or did not answer in time (it is killed): the model is unavailable
    until a new process is started, unlike a batch the child failed and survived."""


class EngineUnavailable(Exception):
    """No engine can answer now (starting, restarting, or given up); ``retry_after`` in seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
