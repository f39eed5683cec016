"""The one error type for configuration that fails validation."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem, located as precisely as we know.

    ``str()`` renders ``FILE:LINE: field: message`` (leaving out the parts we
    do not know), the format editors and CI annotations understand.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.line = line
        self.field = field

    def __str__(self) -> str:
        where = ""
        if self.source:
            where = self.source + (f":{self.line}" if self.line else "") + ": "
        elif self.line:
            where = f"line {self.line}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"
