"""Errors the builder reports as a clear message with exit code 2."""


class BuildInputError(ValueError):
    """The inputs of a build are unusable (bad CSV, empty data, unknown model, version mismatch)."""
