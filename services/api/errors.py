"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and their HTTP status.

Every refusal is an APIError raised where it is found; the app's handlers turn it (and FastAPI's own
validation and routing errors) into the body, and a client's hang-up (ClientGone) into a bare 499.
A code from the scheduler (RequestError.code) maps to a status here, in one table: bad input is a
400, load a 429, nobody to serve a 503. Never a 500 for bad input: anything not in the table is the
server's fault, and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedserve.services.api.disconnect import ClientGone, on_client_gone
from pagedserve.shared.sdk import RequestError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}

# Scheduler / SDK error code -> (HTTP status, the request field it is about).
SCHEDULER_CODES: dict[str, tuple[int, str | None]] = {
    "invalid_request": (400, None),
    "unknown_lora": (404, "model"),
    "lora_unreadable": (500, "model"),  # registered, but its files broke after the load
    "prompt_too_long": (400, "prompt"),
    "max_tokens_too_large": (400, "max_tokens"),
    "token_out_of_vocab": (400, "prompt"),
    "invalid_constraint": (400, "response_format"),  # structured.py names the request's own field
    "invalid_logit_bias": (400, "logit_bias"),
    "too_large_for_pool": (400, "prompt"),
    "duplicate_request_id": (400, "X-Request-Id"),
    "too_many_requests": (429, None),
    "overloaded": (429, None),
    "no_workers": (503, None),
    "timeout": (503, None),
    "closed": (503, None),
}


# Anthropic's error types by status (/v1/messages answers in its shape).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self, request: Request | None = None) -> JSONResponse:
        """In OpenAI's shape, or Anthropic's for a request to its API."""
        anthropic = request is not None and request.url.path.startswith(ANTHROPIC_PATHS)
        return JSONResponse(anthropic_error_body(self) if anthropic else self.body(), status_code=self.status)


def anthropic_error_body(exc: APIError) -> dict[str, Any]:
    kind = ANTHROPIC_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def from_request_error(exc: RequestError, param_prefix: str | None = None) -> APIError:
    status, param = SCHEDULER_CODES.get(exc.code, (500, None))
    if param == "prompt" and param_prefix is not None:
        param = param_prefix  # chat requests name their prompt "messages"
    return APIError(status, exc.message, param, exc.code)


def describe_validation(
    errors: list[Any], drop_prefix: tuple[str, ...] = ("body",)
) -> tuple[str, str | None]:
    """pydantic errors -> one message naming each field and its limit, and the first field's name."""
    parts, first = [], None
    for err in errors[:5]:
        loc = [str(p) for p in err.get("loc", ())]
        while loc and loc[0] in drop_prefix:
            loc = loc[1:]
        field = ".".join(loc) or "(body)"
        first = first or field
        if err.get("type") == "extra_forbidden":
            parts.append(f"{field}: unknown field (not part of this API)")
            continue
        ctx = {k: v for k, v in (err.get("ctx") or {}).items() if k != "error"}
        limit = f" ({', '.join(f'{k}={v}' for k, v in ctx.items())})" if ctx else ""
        parts.append(f"{field}: {err.get('msg', 'invalid')}{limit}")
    if len(errors) > 5:
        parts.append(f"and {len(errors) - 5} more")
    return "; ".join(parts), (None if first == "(body)" else first)


def from_validation_error(exc: ValidationError, rename: dict[str, str] | None = None) -> APIError:
    """A SamplingParams built from the request refused a value: name the request's own field."""
    message, param = describe_validation(exc.errors(), drop_prefix=())
    for ours, theirs in (rename or {}).items():
        if param == ours:
            message = message.replace(f"{ours}:", f"{theirs}:", 1)
            param = theirs
    return APIError(400, message, param, "invalid_value")


@contextmanager
def as_api_errors(prompt_field: str = "prompt") -> Iterator[None]:
    """Inside: an SDK RequestError or a refused Submit surfaces as the APIError a client should see."""
    try:
        yield
    except RequestError as exc:
        raise from_request_error(exc, prompt_field) from None
    except ValidationError as exc:
        raise from_validation_error(exc) from None


# ---------------------------------------------------------------- the app's handlers


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response(request)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = describe_validation(list(exc.errors()))
    return APIError(400, message, param, "invalid_value").response(request)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return APIError(exc.status_code, message, None, None).response(request)


HANDLERS = {
    APIError: on_api_error,
    ClientGone: on_client_gone,
    RequestValidationError: on_validation_error,
    StarletteHTTPException: on_http_error,
}
