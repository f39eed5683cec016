"""The FastAPI application factory: store, migrations, bootstrap, routes, errors.

Every failure, including FastAPI's request validation (which would be a 422
in its own shape) and Starlette's 404/405, leaves as the one error body with
the status of its gRPC code.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException

from meshplane.tracing import Tracing
from mgmt_api import console, trace_middleware
from mgmt_api.distribution.hub import Distribution, certificate_ttl, mesh_ca_settle, tls_from
from mgmt_api.distribution.metrics import DistributionCollector, SidecarCertificateCollector
from mgmt_api.distribution.tunnel import tunnel_servicer
from mgmt_api.domain.client_address import parse_forwarded_header, parse_trusted_proxies
from mgmt_api.domain.durations import parse_duration
from mgmt_api.errors import ApiError, Code
from mgmt_api.identity.runtime import IdentityRuntime
from mgmt_api.middleware import (
    Authenticate,
    BodyLimit,
    ClientAddress,
    Metrics,
    relative_slash_redirect,
)
from mgmt_api.routes import (
    admin,
    approvals,
    cleanup,
    clusters,
    dashboards,
    distribution_status,
    envoyconfig,
    inventory,
    lookup,
    mesh_ca,
    oidc,
    onboarding,
    profiles,
    proxytools,
    resources,
    service_accounts,
    sync,
    workloads,
)
from mgmt_api.routes.deps import authenticate_scope, call_context
from mgmt_api.schemas.base import PATTERN_RULES, ErrorBody
from mgmt_api.service.container import Services
from mgmt_api.service.replicas import ReplicaPeers, store_claim
from mgmt_api.settings import Settings
from mgmt_api.store.engine import create_engine, migrate

log = logging.getLogger(__name__)

API_VERSION = "1.14.0"


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.http_status, headers=error.headers or None)


def _field(loc: tuple[Any, ...]) -> str:
    """The field as the client wrote it: FastAPI's location (``body``, ``query``, ...)
    leads the tuple and is dropped; only there, since a field may be called ``path``
    (an HTTPRoute's ``matches[0].path``)."""
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    parts = [str(p) for p in loc]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def validation_error(exc: RequestValidationError, content_type: str | None = None) -> ApiError:
    """First validation problem as INVALID_ARGUMENT naming the field.

    JSON types are strict (:class:`mgmt_api.schemas.base.ApiModel`): ``"yes"``
    for a boolean or ``"3"`` for a number is refused here, never coerced.
    """
    errors = exc.errors()
    if not errors:
        return ApiError(Code.INVALID_ARGUMENT, "invalid request")
    first = errors[0]
    kind = first.get("type", "")
    field = _field(tuple(first.get("loc", ())))
    if isinstance(first.get("input"), bytes | bytearray) and field == "body":
        # FastAPI hands a body of a non-JSON media type over as bytes.
        given = f"Content-Type {content_type}" if content_type else "no Content-Type"
        return ApiError(
            Code.INVALID_ARGUMENT,
            f"body: send a JSON object with Content-Type: application/json (got {given})",
            field="body",
        )
    if kind == "json_invalid":
        return ApiError(
            Code.INVALID_ARGUMENT,
            f"body: malformed JSON ({first.get('ctx', {}).get('error', 'parse error')})",
            field="body",
        )
    if kind == "extra_forbidden":
        return ApiError(Code.INVALID_ARGUMENT, f"{field}: unknown field", field=field)
    if kind == "missing":
        return ApiError(Code.INVALID_ARGUMENT, f"{field}: is required", field=field)
    rule = PATTERN_RULES.get(str(first.get("ctx", {}).get("pattern", "")))
    if kind == "string_pattern_mismatch" and rule is not None:
        return ApiError(Code.INVALID_ARGUMENT, f"{field}: {rule}", field=field)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return ApiError(Code.INVALID_ARGUMENT, f"{field}: {message}", field=field)


def _custom_openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI with the real error contract: a ``default`` error response, no 422."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorBody"] = ErrorBody.model_json_schema(
        ref_template="#/components/schemas/{model}", mode="serialization"
    )
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    error_ref = {
        "description": "Error (google.rpc.Status)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            responses["default"] = error_ref
            if op.get("security") is None and op.get("operationId") not in oidc.PUBLIC_OPERATIONS:
                op["security"] = [{"basic": []}, {"bearer": []}]
    schema["components"]["securitySchemes"] = {
        "basic": {"type": "http", "scheme": "basic"},
        "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
    }
    app.openapi_schema = schema
    return schema


def _distribution(settings: Settings, services: Services) -> Distribution | None:
    """The gRPC policy stream (and the agent tunnel on it), when a listen address is set."""
    if not settings.grpc_listen or services.registry is None:
        return None
    distribution = Distribution(
        uow=services.uow,
        listen=settings.grpc_listen,
        enforcement=services.enforcement,
        stream_auth=services.stream_auth,
        registry=services.registry,
        attestation=services.attestation,
        tls=tls_from(settings),
        database_url=settings.database_url,
        revision_poll=parse_duration(settings.revision_poll, "MESHPLANE_REVISION_POLL")
        if settings.revision_poll
        else None,
        certificate_ttl=certificate_ttl(settings),
        ca_settle=mesh_ca_settle(settings),
    )
    if services.proxytools is not None:
        # The agent tunnel shares the policy stream's gRPC server, port and TLS.
        distribution.servicers.append(
            tunnel_servicer(distribution, services.proxytools.hub, services.inventory)
        )
    return distribution


def _lifespan(
    engine: Engine,
    distribution: Distribution | None,
    identity: IdentityRuntime,
    peers: ReplicaPeers | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the background parts with the app and stop them (and the pool) with it."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # The gRPC server shares this event loop, so REST writes wake the
        # snapshot streams directly (see mgmt_api.distribution.hub).
        if distribution is not None:
            await distribution.start()
        if peers is not None:
            await peers.start()  # this replica's row in the replica registry
        await identity.start()  # the periodic directory sync
        try:
            yield
        finally:
            await identity.stop()
            if peers is not None:
                await peers.stop()
            if distribution is not None:
                await distribution.stop()
            engine.dispose()  # close pooled connections on SIGTERM

    return lifespan


def _mount_routes(app: FastAPI) -> None:
    """The generated kind routes and the hand-written routers, in matching order."""
    app.include_router(onboarding.router)  # before the generated .../onboarding/{name}
    # Generated from the kind registry, on the app's own router (an included
    # router would make FastAPI match each request twice).
    for generated in (resources, service_accounts, clusters):
        generated.add_routes(app.router)
    for module in (
        inventory,
        lookup,
        cleanup,
        admin,
        distribution_status,
        mesh_ca,
        envoyconfig,
        workloads,
        approvals,
        profiles,
        dashboards,
        proxytools,
        oidc,
        sync,
    ):
        app.include_router(module.router)


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure leaves as the one error body (see the module docstring)."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(validation_error(exc, request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: Code.NOT_FOUND, 405: Code.UNIMPLEMENTED}.get(
            exc.status_code, Code.INVALID_ARGUMENT
        )
        error = ApiError(code, str(exc.detail))
        response = _error_response(error)
        if exc.status_code == 405:
            response.status_code = 405
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"error": type(exc).__name__})
        return _error_response(ApiError(Code.INTERNAL, "internal error"))


def _mount_openapi(app: FastAPI) -> None:
    """The OpenAPI document and its Swagger UI, behind authentication."""
    app.openapi = lambda: _custom_openapi(app)  # type: ignore[method-assign]

    @app.get("/v2/openapi.json", include_in_schema=False)
    def openapi_document(request: Request) -> JSONResponse:
        """The OpenAPI document (needs credentials, as every endpoint but the public ones)."""
        call_context(request)
        return JSONResponse(app.openapi())

    @app.get("/v2/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        call_context(request)
        return get_swagger_ui_html(openapi_url="/v2/openapi.json", title=app.title)


def _install_middleware(
    app: FastAPI, settings: Settings, registry: CollectorRegistry, tracing: Tracing | None
) -> None:
    """The middleware stack; the last added runs first."""
    relative_slash_redirect(app.router)
    # The last added runs first: metrics, then authentication, then the body.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Authenticate, authenticate=authenticate_scope, is_public=oidc.is_public)
    app.add_middleware(Metrics, registry=registry)
    # Outermost: everything inside sees the client's address, not a proxy's.
    app.add_middleware(
        ClientAddress,
        trusted=parse_trusted_proxies(settings.trusted_proxies),
        header=parse_forwarded_header(settings.forwarded_header),
    )
    if tracing is not None:  # off: not installed at all
        app.add_middleware(trace_middleware.Traces, tracing=tracing)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app: open the store, migrate it, bootstrap it, wire services, mount routes."""
    settings = settings or Settings()
    engine = create_engine(settings.database_url)
    migrate(engine)
    services = Services.build(engine, settings)
    distribution = _distribution(settings, services)
    peers = services.proxytools.peers if services.proxytools is not None else None
    identity = IdentityRuntime.build(
        services.uow,
        services.authn,
        install_config=settings.install_config,
        public_url=settings.public_url,
        purge_interval=parse_duration(settings.purge_interval, "MESHPLANE_PURGE_INTERVAL"),
        claim=store_claim(services.uow, peers.replica_id if peers else uuid.uuid4().hex),
    )
    app = FastAPI(
        lifespan=_lifespan(engine, distribution, identity, peers),
        title="meshplane management API",
        version=API_VERSION,
        description="Management plane of a multi-cluster service mesh. See docs/api.md.",
        # Served below, behind authentication like every other endpoint.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    app.state.distribution = distribution
    registry = CollectorRegistry()
    if services.registry is not None:
        registry.register(DistributionCollector(services.registry))
    if services.enforcement.sidecars is not None:
        registry.register(SidecarCertificateCollector(services.enforcement.sidecars))
    if distribution is not None:
        registry.register(distribution.counts)
    app.state.registry = registry
    app.state.identity = identity
    _mount_routes(app)
    # The web console (/ui/): a client of the routes above, in-process (docs/console.md).
    console.mount(app, signing_secret=services.signing_secret, public_url=settings.public_url)
    _install_error_handlers(app)
    _mount_openapi(app)
    _install_middleware(app, settings, registry, _start_tracing(app, services, distribution))
    return app


def _start_tracing(
    app: FastAPI, services: Services, distribution: Distribution | None
) -> Tracing | None:
    """The process's tracer (``OTEL_*``), handed to the parts that make spans:
    the REST middleware, the unit of work (transactions) and the publish."""
    tracing = trace_middleware.start_from_env()
    if tracing is not None:
        app.state.tracing = tracing
        services.uow.tracer = tracing.tracer
        if distribution is not None:
            distribution.tracer = tracing.tracer
    return tracing
