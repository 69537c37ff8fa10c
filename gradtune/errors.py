"""User-facing errors: one line naming the problem, turned into a non-zero exit by the CLI."""


class GradtuneError(Exception):
    """A problem with the user's input or environment, reported as one clear line."""

    exit_code = 2
