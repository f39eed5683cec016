"""``meshctl diag``: ask an ext_authz or ratelimit server exactly as Envoy does.

``diag check`` sends ``envoy.service.auth.v3.Authorization/Check`` with the
request Envoy's ext_authz filter builds (:mod:`meshplane.check_request`);
``diag ratelimit`` sends ``envoy.service.ratelimit.v3.RateLimitService/
ShouldRateLimit`` with the descriptors route ``rate_limits`` actions produce.
Both print the decision with its headers, and the exit code is the decision
(documented in ``docs/meshctl.md``), so scripts and the README's tour can
branch on it:

- 0: allowed / OK;
- 7 (:data:`DENIED`): ext_authz denied, or ratelimit answered OVER_LIMIT;
- 6: the server cannot be reached; 1: any other gRPC failure; 2: bad flags.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import grpc
import typer
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.auth.v3 import external_auth_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import json_format

from meshctl.errors import Exit, MeshctlError
from meshplane.check_request import (
    HttpCall,
    PairError,
    build_check_request,
    describe_check_response,
    parse_address,
    parse_pairs,
)

app = typer.Typer(
    help="Diagnostics: send Check or ShouldRateLimit to a server exactly as Envoy does.",
    no_args_is_help=True,
)

DENIED = 7  # exit code of a deny (ext_authz) or OVER_LIMIT (ratelimit)

ServerOpt = Annotated[str, typer.Option("--server", help="gRPC HOST:PORT of the service.")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="text or json.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the answer.")]


def _pairs(items: list[str] | None, flag: str, *, lower: bool = False) -> dict[str, str]:
    try:
        return parse_pairs(items or [], flag, lower=lower)
    except PairError as exc:
        raise MeshctlError(str(exc), Exit.USAGE) from None


def _output(output: str) -> str:
    if output not in ("text", "json"):
        raise MeshctlError(f"--output must be text or json, not {output!r}", Exit.USAGE)
    return output


def _rpc_failure(server: str, method: str, exc: grpc.RpcError) -> MeshctlError:
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    exit_code = Exit.UNREACHABLE if code == grpc.StatusCode.UNAVAILABLE else Exit.API_ERROR
    return MeshctlError(f"{method} to {server} failed: {code.name}: {details}", exit_code)


@app.command("check")
def check(  # noqa: PLR0917 - typer maps options to parameters
    server: ServerOpt,
    path: Annotated[str, typer.Option("--path", help="Request path, with its query.")] = "/",
    method: Annotated[str, typer.Option("--method", help="Request method.")] = "GET",
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Request header NAME=VALUE.")
    ] = None,
    context_extension: Annotated[
        list[str] | None,
        typer.Option(
            "--context-extension",
            help="Route context extension KEY=VALUE (meshplane.policy=NAME selects a policy).",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help=":authority of the request.")] = "localhost",
    scheme: Annotated[str, typer.Option("--scheme", help="http or https.")] = "http",
    source: Annotated[
        str, typer.Option("--source", help="Downstream peer HOST:PORT.")
    ] = "127.0.0.1:50000",
    destination: Annotated[
        str, typer.Option("--destination", help="Envoy listener HOST:PORT.")
    ] = "127.0.0.1:8080",
    output: OutputOpt = "text",
    timeout: TimeoutOpt = 5.0,
) -> None:
    """Send one ext_authz Check (exit 0 allowed, 7 denied)."""
    fmt = _output(output)
    call = HttpCall(
        method=method.upper(),
        path=path,
        host=host,
        scheme=scheme,
        headers=_pairs(header, "--header", lower=True),
        context_extensions=_pairs(context_extension, "--context-extension"),
        source=parse_address(source, 0),
        destination=parse_address(destination, 0),
    )
    with grpc.insecure_channel(server) as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        try:
            response = stub.Check(build_check_request(call), timeout=timeout)
        except grpc.RpcError as exc:
            raise _rpc_failure(server, "Check", exc) from None
    result = describe_check_response(response)
    typer.echo(json.dumps(result, indent=2) if fmt == "json" else _check_text(result))
    if not result["allowed"]:
        raise typer.Exit(DENIED)


def _check_text(result: dict[str, Any]) -> str:
    grpc_name = grpc.StatusCode.OK.name
    for code in grpc.StatusCode:
        if code.value[0] == result["grpc_status"]:
            grpc_name = code.name
    if result["allowed"]:
        lines = [f"ALLOWED (gRPC {grpc_name})"]
    else:
        lines = [f"DENIED: HTTP {result['http_status'] or 403} (gRPC {grpc_name})"]
    if result["headers"]:
        lines.append("headers:")
        lines += [f"  {k}: {v}" for k, v in result["headers"].items()]
    if result.get("headers_to_remove"):
        lines.append("headers to remove: " + ", ".join(result["headers_to_remove"]))
    if result.get("body"):
        lines.append(f"body: {result['body']}")
    return "\n".join(lines)


def parse_descriptor(text: str) -> ratelimit_pb2.RateLimitDescriptor:
    """``k=v,k2=v2`` → one descriptor whose entries are in that order."""
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise MeshctlError(f"--descriptor {text!r}: {item!r} is not KEY=VALUE", Exit.USAGE)
        descriptor.entries.add(key=key.strip(), value=value)
    return descriptor


def _rls_code(code: int) -> str:
    return str(rls_pb2.RateLimitResponse.Code.Name(code))


def describe_rls_response(response: rls_pb2.RateLimitResponse) -> dict[str, Any]:
    """The overall code, per-descriptor statuses and headers as plain data."""
    statuses = []
    for status in response.statuses:
        entry: dict[str, Any] = {"code": _rls_code(status.code)}
        if status.HasField("current_limit"):
            entry["currentLimit"] = json_format.MessageToDict(status.current_limit)
            entry["limitRemaining"] = status.limit_remaining
        if status.HasField("duration_until_reset"):
            entry["durationUntilReset"] = f"{status.duration_until_reset.ToSeconds()}s"
        statuses.append(entry)
    return {
        "overallCode": _rls_code(response.overall_code),
        "statuses": statuses,
        "responseHeaders": {h.key: h.value for h in response.response_headers_to_add},
        "requestHeaders": {h.key: h.value for h in response.request_headers_to_add},
    }


def _rls_text(call: int, result: dict[str, Any]) -> str:
    lines = [f"#{call}: {result['overallCode']}"]
    for i, status in enumerate(result["statuses"]):
        limit = status.get("currentLimit")
        detail = ""
        if limit:
            detail = (
                f" limit {limit.get('requestsPerUnit', 0)}/{limit.get('unit', '?')}"
                f" remaining {status.get('limitRemaining', 0)}"
            )
        if "durationUntilReset" in status:
            detail += f" reset in {status['durationUntilReset']}"
        lines.append(f"  descriptor[{i}]: {status['code']}{detail}")
    for key, value in result["responseHeaders"].items():
        lines.append(f"  {key}: {value}")
    for key, value in result["requestHeaders"].items():
        lines.append(f"  (to upstream) {key}: {value}")
    return "\n".join(lines)


@app.command("ratelimit")
def ratelimit(  # noqa: PLR0917 - typer maps options to parameters
    server: ServerOpt,
    domain: Annotated[str, typer.Option("--domain", help="Rate-limit domain.")],
    descriptor: Annotated[
        list[str],
        typer.Option(
            "--descriptor", "-d", help="Descriptor KEY=VALUE[,KEY=VALUE...] (repeatable)."
        ),
    ],
    hits: Annotated[
        int, typer.Option("--hits", help="hits_addend: what each call costs (0: Envoy's 1).")
    ] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Send the same call N times.")] = 1,
    output: OutputOpt = "text",
    timeout: TimeoutOpt = 5.0,
) -> None:
    """Send ShouldRateLimit (exit 0 OK, 7 OVER_LIMIT on the last call)."""
    fmt = _output(output)
    if hits < 0 or repeat < 1:
        raise MeshctlError("--hits must be >= 0 and --repeat >= 1", Exit.USAGE)
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[parse_descriptor(d) for d in descriptor], hits_addend=hits
    )
    results: list[dict[str, Any]] = []
    with grpc.insecure_channel(server) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for n in range(1, repeat + 1):
            try:
                response = stub.ShouldRateLimit(request, timeout=timeout)
            except grpc.RpcError as exc:
                raise _rpc_failure(server, "ShouldRateLimit", exc) from None
            result = describe_rls_response(response)
            results.append(result)
            if fmt == "text":
                typer.echo(_rls_text(n, result))
    if fmt == "json":
        typer.echo(json.dumps(results[0] if repeat == 1 else results, indent=2))
    last = results[-1]["overallCode"]
    if last == "OVER_LIMIT":
        raise typer.Exit(DENIED)
    if last != "OK":
        raise MeshctlError(f"ShouldRateLimit answered {last}", Exit.API_ERROR)
