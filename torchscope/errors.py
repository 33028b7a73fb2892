"""Typed errors that carry an exit code and a one-line message.

Library code raises these; only the CLI turns them into a line on stderr and an exit status.
"""

from __future__ import annotations


class TorchscopeError(Exception):
    """Base class: a problem the user can act on, reported as one line."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split())


class InputError(TorchscopeError):
    """A path or file given to torchscope cannot be used (missing, corrupt, not a trace)."""

    exit_code = 2


class TraceFormatError(InputError):
    """A file was read but is not a usable Kineto trace."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # picklable across the process pool
        return (type(self), (self.path, self.problem))


class UsageError(TorchscopeError):
    """Wrong command-line usage."""

    exit_code = 2


class CaptureError(TorchscopeError):
    """The profiler could not be set up or its output could not be written."""

    exit_code = 1
