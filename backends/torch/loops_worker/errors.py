"""Errors with gRPC status codes (the numbers of google.rpc.Code)."""

from __future__ import annotations

CANCELLED = 1
INVALID_ARGUMENT = 3
NOT_FOUND = 5
ALREADY_EXISTS = 6
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
INTERNAL = 13
UNAVAILABLE = 14


class WorkerError(Exception):
    """An error the worker reports with a status code and a message for the user."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(msg: str) -> WorkerError:
    return WorkerError(INVALID_ARGUMENT, msg)


def not_found(msg: str) -> WorkerError:
    return WorkerError(NOT_FOUND, msg)
