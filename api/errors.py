"""The API's error shape, `{"error": {"type", "detail"}}`: the schema it is documented with, the
response every handler and middleware answers with, and the words of a validation error (the
gRPC gateway's detail too)."""

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


def describe_validation(errors: list[dict]) -> str:
    """A validation error's detail: `<where>: <message>` for each error, `; `-joined. `where` is
    the error's location without "body" ("scope.user_id", "query.tags.1"), or "body"."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")  # "query.tags.1" stays
        message = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            message = f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})"
        parts.append(f"{where or 'body'}: {message}")
    return "; ".join(parts)
