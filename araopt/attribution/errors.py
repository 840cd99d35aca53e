"""The exceptions the Attribution API throws, by their JavaScript name."""
from __future__ import annotations

from enum import StrEnum

from araopt.errors import InvalidInput


class ErrorName(StrEnum):
    """The JavaScript error the API throws (``SyntaxError`` is a ``DOMException`` of that name).

    ``TypeError`` stands for a WebIDL conversion failure (an option that is not an unsigned long, a
    long or a finite double) and for a caller that passes a host that is not a site: the reference
    implementation asserts both."""

    RANGE_ERROR = "RangeError"
    REFERENCE_ERROR = "ReferenceError"
    SYNTAX_ERROR = "SyntaxError"
    TYPE_ERROR = "TypeError"


class ApiError(InvalidInput):
    """An exception of ``saveImpression`` / ``measureConversion`` / clearing: ``name`` is its JS name."""

    def __init__(self, name: ErrorName, message: str) -> None:
        super().__init__(f"{name.value}: {message}")
        self.name = name
