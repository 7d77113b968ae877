"""Errors that reach a user as one line, never as a traceback."""


class MemclaimsError(Exception):
    """Base class: the message is complete and names the culprit and what to do."""


class UsageError(MemclaimsError):
    """Bad input from the user: an unknown name, an invalid combination, a malformed value."""


class DataError(MemclaimsError):
    """A data directory or data file that does not hold what it should."""


class OutOfMemory(MemclaimsError):
    """A run that ran out of device (or host) memory: a result to record, not a crash."""

    def __init__(self, recipe_id: str, device: str, phase: str, requested_bytes: int | None, detail: str) -> None:
        self.recipe_id, self.device, self.phase, self.requested_bytes = recipe_id, device, phase, requested_bytes
        size = f"{requested_bytes} B ({requested_bytes / 2**20:.1f} MiB)" if requested_bytes is not None else "an unknown size"
        super().__init__(f"{recipe_id} ran out of memory on {device} in the {phase} phase "
                         f"while allocating {size}: {detail}")
