"""Domain errors. Each carries a stable `type`; every gateway maps them with one handler."""

from __future__ import annotations


class EngramError(Exception):
    """Base of every error the service raises on purpose."""

    type = "internal"
    http_status = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ValidationFailed(EngramError):
    type = "validation_error"
    http_status = 422


class Unauthenticated(EngramError):
    type = "unauthenticated"
    http_status = 401


class Forbidden(EngramError):
    type = "forbidden"
    http_status = 403


class NotFound(EngramError):
    type = "not_found"
    http_status = 404


class Conflict(EngramError):
    type = "conflict"
    http_status = 409


class ConfigError(EngramError):
    """A setting that cannot work: raised at start-up, never per request."""

    type = "config_error"
    http_status = 500


class ModelFileMismatch(ConfigError):
    type = "model_file_mismatch"


class EmbeddingUnavailable(EngramError):
    """The embedding model could not embed (a remote embedder down or answering badly).
    `permanent`: it refused this very text (say, too long for it); retrying cannot help."""

    type = "embedding_unavailable"
    http_status = 503

    def __init__(self, detail: str, *, permanent: bool = False) -> None:
        super().__init__(detail)
        self.permanent = permanent


class DatabaseUnavailable(EngramError):
    """Postgres cannot be reached (down, restarting, out of connections): nothing was stored;
    the same request can be retried."""

    type = "database_unavailable"
    http_status = 503


class ImportStillWriting(EngramError):
    """A bulk remember that a worker was still writing when the request stopped waiting: its
    items are staged in Postgres and will be stored, nothing is lost; sent again with the same
    Idempotency-Key, it gets each item's answer."""

    type = "import_still_writing"
    http_status = 503


class Contention(DatabaseUnavailable):
    """Postgres rolled the request's transaction back, to break a deadlock with concurrent work:
    nothing was stored; the same request can be retried."""

    type = "contention"


class VersionConflict(Conflict):
    """`if_version` is not the memory's version: nothing was changed."""

    type = "version_conflict"

    def __init__(self, detail: str, current_version: int) -> None:
        super().__init__(detail)
        self.current_version = current_version


class Gone(EngramError):
    """What was asked for existed and can no longer be had (a delete past its recovery window)."""

    type = "gone"
    http_status = 410


class RateLimited(EngramError):
    type = "rate_limited"
    http_status = 429

    def __init__(self, detail: str, retry_after_s: float) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s
