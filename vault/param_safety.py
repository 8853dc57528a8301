"""Parameter values that would steer a call elsewhere: the confused-deputy checks.

Why: the vault holds the credential and sends it where the catalog says; the
agent only fills in values. A value must never change *where* that is. An
issue id of `..`, sent as `/v1/issues/..`, is resolved by real servers and
proxies (RFC 3986 dot segments) to `/v1/`, so the vault would present the
tracker credential to an endpoint the catalog never allowed. Quoting alone
does not help: `%2e%2e` is resolved the same way by many servers, some
proxies decode twice, some frameworks fold Unicode (NFKC: `．．` is `..`).
So each value is checked as given, in its NFKC form and in every
percent-decoding of those, against what may not appear where it goes:

    goes to   refused (always, whatever the catalog declares)
    --------  ----------------------------------------------------------------
    path      empty or blank; `.` or `..` (also `..;x`, a path parameter);
              `/`, `\\`, `?`, `#`; control or invisible format characters
    command   empty or blank; `.` or `..`; `/` or `\\`; a leading `-` (read as
              an option); control or invisible format characters. Checked as
              given only: the remote shell decodes nothing, and the value is
              shell-quoted
    query     control characters (the encoder escapes `&`, `=`, `#`, `+`, so
              a value cannot add a parameter)
    body      nothing more: JSON carries any text

A refusal names the parameter and the rule, never the value. Executors turn it
into a `local_failure` with nothing sent (vault.catalog.Operation.refusal).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any
from urllib.parse import unquote

_DOTS = (".", "..")
_PATH_SEPARATOR = re.compile(r"[/\\?#]")
_COMMAND_SEPARATORS = frozenset("/\\")
# control, invisible format (bidi overrides, zero-width), line and paragraph separators
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
_CONTROL = frozenset({"Cc", "Zl", "Zp"})
_MAX_FORMS = 16
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def problem(where: str, value: Any) -> str | None:
    """Why `value` must not go to `where` ("path", "query", "command", "body"), or None."""
    if where == "body" or isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    if where == "path":
        for form in forms(text, decode=True):
            why = _path_problem(form)
            if why is not None:
                return why
        return None
    if where == "command":
        return _command_problem(text)
    if where == "query":
        for form in forms(text, decode=True):
            if _hidden(form, _CONTROL):
                return "holds or decodes to a control character"
        return None
    raise ValueError(f"unknown parameter position {where!r}")


def forms(text: str, *, decode: bool) -> list[str]:
    """`text`, its NFKC form and (with `decode`) each percent-decoding of those, up to a few rounds."""
    if text.isascii() and "%" not in text:
        return [text]  # the common case, on every call: nothing to fold or decode
    seen = [text]
    i = 0
    while i < len(seen) and len(seen) < _MAX_FORMS:
        current = seen[i]
        i += 1
        candidates = [unicodedata.normalize("NFKC", current)]
        if decode and "%" in current:
            candidates.append(unquote(current, errors="replace"))
        for candidate in candidates:
            if candidate not in seen:
                seen.append(candidate)
    return seen


def _path_problem(form: str) -> str | None:
    if not form.strip():
        return "is empty or blank (a path segment must name something)"
    if _is_dot_segment(form):
        return ("is a dot segment ('.' or '..') as given or decoded: a server would resolve it to "
                "another path")
    if _PATH_SEPARATOR.search(form):
        return ("holds or decodes to '/', '\\', '?' or '#', which would move the request to another "
                "path")
    if _hidden(form, _HIDDEN):
        return "holds or decodes to a control or invisible format character"
    return None


def _command_problem(text: str) -> str | None:
    if not text.strip():
        return "is empty or blank"
    if _is_dot_segment(text) or _COMMAND_SEPARATORS.intersection(text):
        return "is '.' or '..' or holds '/' or '\\': it must name something, not a path"
    if text.startswith("-"):
        return "starts with '-', which the command would read as an option"
    if _hidden(text, _HIDDEN):
        return "holds a control or invisible format character"
    return None


def _is_dot_segment(form: str) -> bool:
    if "." not in form:
        return False
    # `..;jsessionid=x` is `..` to servers that strip path parameters (Tomcat, Jetty)
    return form.strip() in _DOTS or form.split(";", 1)[0].strip() in _DOTS


def _hidden(text: str, categories: frozenset[str]) -> bool:
    if text.isascii():  # the common case, on every call: ASCII has only Cc of these
        return _ASCII_CONTROL.search(text) is not None
    return any(unicodedata.category(ch) in categories for ch in text)
