"""The readiness report's wire model (`GET /readyz`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Readiness(BaseModel):
    """`ready`: every component is; `components`: each one's state, by name (`ok` and details)."""

    ready: bool
    components: dict[str, Any]
