"""The API's error shape, `{"error": {"type", "detail"}}`: the schema it is documented with and
the response every handler and middleware answers with."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.responses import JSONResponse


class ErrorDetail(BaseModel):
    type: str
    detail: str
    current_version: int | None = None  # a version conflict's: the memory's version now


class ErrorBody(BaseModel):
    """Every error the API answers."""

    error: ErrorDetail


def error_body(status: int, type_: str, detail: str, headers: dict[str, str] | None = None, **extra) -> JSONResponse:
    """The error response; `extra` adds fields beside type and detail (ErrorDetail lists them)."""
    return JSONResponse(status_code=status, content={"error": {"type": type_, "detail": detail, **extra}},
                        headers=headers)
