"""The fake remote's API: one route table for every catalog service.

Routes are named after the catalog operations they serve (`create_issue`,
`read_build`, ...) so a fault can target one by name. Handlers are plain,
synchronous functions over the Store; faults, auth, idempotency and the ledger
live around them in vault/remote/service.py.

    GET    /v1/issues/{id}             read_issue
    POST   /v1/issues                  create_issue       honours Idempotency-Key
    POST   /v1/issues/{id}/notes       attach_note        honours Idempotency-Key
    GET    /v1/releases/{id}           read_release
    DELETE /v1/releases/{id}           delete_release     honours Idempotency-Key
    GET    /v1/builds?ref=R            list_builds        newest first (number desc)
    GET    /v1/builds/{id}             read_build
    POST   /v1/deployments             create_deployment  IGNORES Idempotency-Key
    GET    /v1/deployments/{id}        read_deployment
    PUT    /v1/records/{id}            update_record      honours Idempotency-Key
    GET    /v1/records/{id}            read_record
    GET    /v1/operations?request_id=X | ?idempotency_key=K   operation_status

Errors use one envelope: `{"error": CODE, "message": TEXT, "done": false}`;
`done: false` is the remote's statement that it did not do the work.

Routing is on the path as a permissive real server resolves it
(`resolve_path`: decoded once, dot segments removed), so a test sees where a
real service would send a request whose parameters steer it (`/v1/issues/..`
is `/v1/`, no route), not an id that happens to be `..`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from vault.remote.state import Store


@dataclass
class Handled:
    status: int
    body: Any
    committed: bool = False
    resources: list[dict[str, str]] = field(default_factory=list)


def error(status: int, code: str, message: str) -> Handled:
    return Handled(status, {"error": code, "message": message, "done": False})


Handler = Callable[[Store, dict[str, str], dict[str, str], dict[str, Any]], Handled]


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    pattern: re.Pattern[str]
    handler: Handler | None
    mutates: bool = False
    honours_idempotency: bool = False


def _read(table: str, key: str, kind: str) -> Handler:
    def handler(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
        item = getattr(store, table).get(path[key])
        if item is None:
            return error(404, "not_found", f"no such {kind}")
        return Handled(200, dict(item))
    return handler


def _create_issue(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    title = body.get("title")
    if not isinstance(title, str) or not title:
        return error(422, "invalid_request", "title is required")
    text = body.get("body", "")
    issue = {"id": store.next_id("ISS", start=2), "title": title,
             "body": text if isinstance(text, str) else "", "state": "open"}
    store.issues[issue["id"]] = issue
    return Handled(201, dict(issue), True, [{"type": "issue", "id": issue["id"]}])


def _attach_note(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    if path["issue_id"] not in store.issues:
        return error(404, "not_found", "no such issue")
    text = body.get("text")
    if not isinstance(text, str) or not text:
        return error(422, "invalid_request", "text is required")
    note = {"id": store.next_id("N"), "issue_id": path["issue_id"], "text": text}
    store.notes[note["id"]] = note
    return Handled(201, dict(note), True, [{"type": "note", "id": note["id"]}])


def _delete_release(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    release = store.releases.get(path["release_id"])
    if release is None or release["state"] == "deleted":
        return error(404, "not_found", "no such release")
    release["state"] = "deleted"
    return Handled(200, dict(release), True, [{"type": "release", "id": release["id"]}])


def _list_builds(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    items = [dict(b) for b in store.builds.values() if b["ref"] == query.get("ref", "main")]
    items.sort(key=lambda b: b["number"], reverse=True)
    return Handled(200, {"items": items})


def _create_deployment(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    env, version = body.get("environment"), body.get("version")
    if not isinstance(env, str) or not env or not isinstance(version, str) or not version:
        return error(422, "invalid_request", "environment and version are required")
    dep = {"id": store.next_id("dep"), "environment": env, "version": version, "status": "started"}
    store.deployments[dep["id"]] = dep
    return Handled(201, dict(dep), True, [{"type": "deployment", "id": dep["id"]}])


def _update_record(store: Store, path: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Handled:
    record = store.records.get(path["record_id"])
    if record is None:
        return error(404, "not_found", "no such record")
    value = body.get("value")
    if not isinstance(value, str):
        return error(422, "invalid_request", "value is required")
    record["value"] = value
    record["revision"] += 1
    return Handled(200, dict(record), True, [{"type": "record", "id": record["id"]}])


_SEG = r"(?P<{}>[^/]+)"


def _route(name: str, method: str, path: str, handler: Handler | None,
           mutates: bool = False, idem: bool = False) -> Route:
    regex = re.sub(r"\{(\w+)\}", lambda m: _SEG.format(m.group(1)), path)
    return Route(name, method, re.compile(regex + r"\Z"), handler, mutates, idem)


ROUTES: list[Route] = [
    _route("read_issue", "GET", "/v1/issues/{issue_id}", _read("issues", "issue_id", "issue")),
    _route("create_issue", "POST", "/v1/issues", _create_issue, True, True),
    _route("attach_note", "POST", "/v1/issues/{issue_id}/notes", _attach_note, True, True),
    _route("read_release", "GET", "/v1/releases/{release_id}", _read("releases", "release_id", "release")),
    _route("delete_release", "DELETE", "/v1/releases/{release_id}", _delete_release, True, True),
    _route("list_builds", "GET", "/v1/builds", _list_builds),
    _route("read_build", "GET", "/v1/builds/{build_id}", _read("builds", "build_id", "build")),
    # documented: deployments ignore Idempotency-Key, every POST starts one
    _route("create_deployment", "POST", "/v1/deployments", _create_deployment, True, False),
    _route("read_deployment", "GET", "/v1/deployments/{deployment_id}",
           _read("deployments", "deployment_id", "deployment")),
    _route("update_record", "PUT", "/v1/records/{record_id}", _update_record, True, True),
    _route("read_record", "GET", "/v1/records/{record_id}", _read("records", "record_id", "record")),
    _route("operation_status", "GET", "/v1/operations", None),
]


def resolve_path(raw: str) -> str:
    """The path a permissive real server routes for the raw request path.

    Percent-decoded once (`%2F` included, as servers that decode before
    routing do), `\\` read as `/` (IIS, WHATWG URLs), then dot segments removed
    (RFC 3986 5.2.4), a segment like `..;x` counting as `..` (Tomcat, Jetty). So
    `/v1/issues/..` routes to `/v1/` and `/v1/issues/x%2F..%2F..%2Freleases%2Fr-1`
    to `/v1/releases/r-1`, where a real service would send them."""
    return remove_dot_segments(unquote(raw, errors="replace").replace("\\", "/"))


def remove_dot_segments(path: str) -> str:
    segments = path.split("/")[1:] if path.startswith("/") else path.split("/")
    out: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        dots = segment.split(";", 1)[0]
        if dots == ".":
            if last:
                out.append("")
        elif dots == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out)


def match(method: str, path: str) -> tuple[Route | None, dict[str, str], int]:
    """(route, path params, 0) or (None, {}, 404/405), for a path already resolved
    (`resolve_path`): its parameters are taken as they stand, decoded."""
    allowed = False
    for route in ROUTES:
        m = route.pattern.match(path)
        if m:
            if route.method == method:
                return route, m.groupdict(), 0
            allowed = True
    return None, {}, 405 if allowed else 404


def route_named(name: str) -> Route | None:
    return next((r for r in ROUTES if r.name == name), None)
