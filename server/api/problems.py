"""RFC 9457 problem details for every error, and the request-size limit.

No error response ever carries a stack trace or echoes the request body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("svc_server.api")


class Problem(BaseModel):
    """An RFC 9457 problem details object."""

    type: str = Field("about:blank", description="URI identifying the problem type")
    title: str = Field(description="Short summary of the problem type")
    status: int = Field(description="HTTP status code")
    detail: str | None = Field(None, description="Explanation of this occurrence")
    errors: list[dict[str, Any]] | None = Field(
        None, description="Per-field validation errors (422 only)"
    )


class ProblemError(Exception):
    """Raised by routes and dependencies; rendered as problem+json."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug
        self.headers = headers


def rate_limited(detail: str, retry_after: int) -> ProblemError:
    return ProblemError(429, detail, slug="rate-limited", headers={"Retry-After": str(retry_after)})


def problem_response(
    status: int,
    detail: str | None,
    *,
    slug: str | None = None,
    headers: Mapping[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:svc:problem:{slug}" if slug else "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
    }
    if detail:
        body["detail"] = detail
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem responses an operation can return."""
    return {
        status: {
            "model": Problem,
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """One entry per failing field: ``field`` (dotted, within its location), ``pointer``
    (a JSON Pointer into the body, as RFC 9457's example extension has it), ``detail``,
    and pydantic's ``loc``, ``msg`` and ``type``. Never the offending input, which may be
    a secret."""
    errors = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        # loc starts with where the value was: body, query, path or header.
        where, path = (loc[0], loc[1:]) if loc else ("body", [])
        entry: dict[str, Any] = {
            "field": ".".join(path) or where,
            # pydantic prefixes a validator's own message with "Value error, ".
            "detail": str(err.get("msg", "invalid value")).removeprefix("Value error, "),
            "loc": loc,
            "msg": err.get("msg"),
            "type": err.get("type"),
        }
        if where == "body":
            entry["pointer"] = "#/" + "/".join(
                p.replace("~", "~0").replace("/", "~1") for p in path
            )
        errors.append(entry)
    return errors


def install(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.detail, slug=exc.slug, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else None
        return problem_response(exc.status_code, detail, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc)
        if any(e["type"] == "json_invalid" for e in errors):
            return problem_response(400, "request body is not valid JSON", slug="malformed-json")
        fields = "; ".join(f"{e['field']}: {e['detail']}" for e in errors)
        return problem_response(422, f"invalid request: {fields}", errors=errors)

    @app.exception_handler(OperationalError)
    async def _database(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable: %s", exc.__class__.__name__)
        return problem_response(
            503, "database unavailable, retry shortly", headers={"Retry-After": "1"}
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return problem_response(500, "internal error")


class BodyLimit:
    """Rejects request bodies above ``max_bytes`` with a 413 problem, by Content-Length or
    while reading, before the application sees them. Bodies are small (64 KiB by default),
    so the body is read here in full and handed on in one piece. (Starlette's own body
    limiter answers with plain text, not RFC 9457.)"""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = problem_response(
            413, f"request body exceeds {self.max_bytes} bytes", slug="body-too-large"
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await problem_response(400, "invalid Content-Length")(scope, receive, send)
                    return
                if declared > self.max_bytes:
                    await too_large(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
