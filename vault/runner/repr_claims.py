"""A result object printed in its language's default string form: the `status` it states.

An agent written in another language often ends by printing its result object as that language
shows one (docs/agent-contract.md §7):

    Python dataclass, namedtuple, attrs   Result(status='done', steps=2)    Outcome(status=<Status.DONE: 'done'>)
    Java record, Kotlin data class        Result[status=done, steps=2]      Result(status=done, steps=2)
    Rust Debug, C# record, Node           Result { status: Done, steps: 2 } Outcome { status: "done" }
    Go %+v (and %#v)                      {Status:done Steps:2}  &{Status:done Steps:2}  main.R{Status:"done"}
    Ruby inspect, Elixir inspect          {:status=>:done}  {"status"=>"done"}  %{status: :done}  %Result{status: "done"}
    Node's marks before a brace           <ref *1> { status: 'done' }  [Object: null prototype] { status: 'done' }
                                          Map(2) { 'status' => 'done', 'steps' => 3 }

Its `status` field (any case) is read as a JSON `status` is (vault.runner.claims), and without
one its `ok` and `category`, as a JSON Result's are (`Result(ok=True, category='success')`), but only when
the whole line is one such object: a name (or none, before a brace) and a bracketed list of named
fields whose brackets and quotes balance. A `status=done` in prose, inside a quoted string or a
nested object, is no field of it; Go's `%v` (`&{done 2}`) names no field and states nothing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

# the object's type name (none before a brace: Go, Node, Ruby; Elixir's map and struct after a
# `%`: `%{status: :done}`, `%Result{status: "done"}`), then its opening bracket; Python,
# Java and Kotlin write `(` or `[` right after the name (`done (status: x)` is a word and a note)
_HEAD = re.compile(r"[&%]?(?:([A-Za-z_][\w$]*(?:(?:\.|::)[A-Za-z_][\w$]*)*)(\s*))?([(\[{])")
_CLOSE = {"(": ")", "[": "]", "{": "}"}
# what the scan stops at; text between is skipped whole (linear on a 4 MiB line)
_STOP = re.compile(r"""[()\[\]{}'",]|\s+""")
_STRING = {"'": re.compile(r"[^'\\]*(?:\\.[^'\\]*)*'", re.S), '"': re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)}
# a quote opens a string only where a value or an element starts: Java, Kotlin and Go print
# strings unquoted, so the `'` in `message=don't` is text
_OPENS_STRING = frozenset("([{,=:<>")
# a field: its name, then `=` (Python, Java, Kotlin, C#) or `:` (Rust, Go, Node); or a key in
# single quotes, as Python prints a dict (`{'status': 'done', 'at': datetime.datetime(...)}`): a
# dict holding a value that is no literal (a datetime, a UUID, an Enum member) is read so; or
# a Ruby hash's or Elixir map's key before `=>` (`{:success=>false}`, `%{"status" => "done"}`)
_KEY = re.compile(r"\s*:?(['\"]?)([A-Za-z_]\w*)\1\s*(?:=>|[=:])\s*")
# Python's repr of an enum member: `<Status.DONE: 'done'>` (its value), `<Status.DONE: 1>` (its name)
_ENUM = re.compile(r"<[A-Za-z_][\w.]*\.([A-Za-z_]\w*): (.*)>", re.S)
# an enum member by its path (`Status.DONE`, `Status::Done`): its name
_PATH = re.compile(r"[A-Za-z_]\w*(?:(?:\.|::)[A-Za-z_]\w*)+")
_ATOM = re.compile(r":[A-Za-z_]\w*")  # a Ruby symbol or Elixir atom as a value: its name
_SHORT = 4096  # a value parsed further than as text (a status is a word; its claim is its first)


def _top_level(text: str, i: int) -> Iterator[tuple[str, int, int]]:
    """The separators (`,`, or a run of whitespace as " ") directly inside the object whose
    opening bracket ends at `i`, as (separator, start, end); then ("end", ...) at its closing
    bracket, or ("", ...) where its brackets or quotes do not balance."""
    stack = [_CLOSE[text[i - 1]]]
    ws_start = ws_end = -1  # the last run of whitespace: a quote after it opens by what precedes it
    while (m := _STOP.search(text, i)) is not None:
        tok, at, i = m.group(0), m.start(), m.end()
        c = tok[0]
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c in ")]}":
            if c != stack.pop():
                break
            if not stack:
                yield ("end", at, i)
                return
        elif c in _STRING:
            before = text[(ws_start if at == ws_end else at) - 1]
            if before in _OPENS_STRING:
                s = _STRING[c].match(text, i)
                if s is None:
                    break
                i = s.end()
        elif c == ",":
            if len(stack) == 1:
                yield (",", at, i)
        else:
            ws_start, ws_end = at, i
            if len(stack) == 1:
                yield (" ", at, i)
    yield ("", len(text), len(text))


def repr_statuses(text: str) -> list[str] | None:
    """The values of the `status` fields of the object `text` is whole (usually one; a Java
    value's unquoted text may hold another), or None when `text` is no such object."""
    fields = repr_fields(text)
    return None if fields is None else fields.get("status", [])


# the fields a claim is read from (vault.runner.claims), as a JSON final message's are
CLAIM_FIELDS = frozenset({"status", "ok", "category"})
# and a field named by a claim word (`success: false`, `Done:true`, `awaiting_approval`): its
# boolean says that word or nothing (vault.runner.claims), never the line's first word
FLAG_WORDS = frozenset({"done", "complete", "completed", "finished", "success", "succeeded", "successful",
                        "successfully", "waiting", "pending", "awaiting"})


# what Node's util.inspect writes before an object's brace: a circular object's reference mark
# (`<ref *1> { status: 'done', self: [Circular *1] }`), a null prototype (`[Object: null
# prototype] { status: 'done' }`, Object.create(null)'s), a Map's size (`Map(2) { 'status' =>
# 'done', 'steps' => 3 }`, its entries keyed as a Ruby hash's are): the object is the same
_NODE_MARK = re.compile(r"(?:<ref \*\d+>\s+)?(?:\[[A-Za-z_$][\w$]*: null prototype\]\s+|Map\(\d+\)\s+(?=\{))?")


def _unmarked(text: str) -> str:
    mark = _NODE_MARK.match(text)  # (it always matches, maybe nothing)
    return text if mark is None else text[mark.end():]


def repr_fields(text: str) -> dict[str, list[str]] | None:
    """The values of the `status`, `ok` and `category` fields (any case) of the object `text`
    is whole, and of those named by a claim word (FLAG_WORDS), by lower-case name, or None when
    `text` is no such object."""
    text = _unmarked(text)
    head = _HEAD.match(text)
    if head is None:
        return None
    name, gap, opening = head.groups()
    if (name is None or gap) and opening != "{":
        return None
    start = head.end()
    commas, end = False, -1
    for sep, at, after in _top_level(text, start):
        if sep == ",":
            commas = True
        elif sep == "end" and after == len(text):  # the object ends the line
            end = at
    if end < 0:
        return None
    # fields are separated by commas; Go's %+v has none, a space between fields
    mode = "," if commas or name is not None else " "
    first = _KEY.match(text, start)
    if first is None or first.end() > end:
        return None
    out: dict[str, list[str]] = {}
    field = first
    for sep, at, after in _top_level(text, start):
        if sep not in (mode, "end") or at < field.end():
            continue
        nxt = _KEY.match(text, after) if sep != "end" else None
        if sep != "end" and (nxt is None or nxt.end() > end):
            continue  # no field starts here: a value's own comma or space (Java, Go print text bare)
        if (key := field.group(2).lower()) in CLAIM_FIELDS or key.split("_")[0] in FLAG_WORDS:
            out.setdefault(key, []).append(_value(text[field.end():at]))
        if nxt is None:
            break
        field = nxt
    return out


def _value(raw: str) -> str:
    """A field's value as its status word: a string's text, an enum member's value or name."""
    v = raw.strip()
    if len(v) > _SHORT:
        return v
    enum = _ENUM.fullmatch(v)
    if enum is not None:
        value = _string(enum.group(2).strip())
        return value if value is not None else enum.group(1)
    value = _string(v)
    if value is not None:
        return value
    if _ATOM.fullmatch(v):  # a Ruby symbol, an Elixir atom: `:done`
        v = v[1:]
    variant = _VARIANT.match(v)
    if variant is not None and _CLOSE[variant.group(2)] == v[-1]:
        v = variant.group(1)  # an enum variant with data (`AwaitingApproval { token: "r-1" }`): its name
    if _PATH.fullmatch(v):
        v = re.split(r"\.|::", v)[-1]
    # a variant named in CamelCase (Rust, C#, Kotlin enums) as its words: `AwaitingApproval`
    # is `awaiting_approval`, `NotDone` `not_done`, `ApprovalPending` the Result's own word
    return _CAMEL.sub("_", v).lower() if _CAMELCASE.fullmatch(v) else v


_VARIANT = re.compile(r"([A-Za-z_]\w*(?:(?:\.|::)[A-Za-z_]\w*)*)\s*([({\[])")
_CAMELCASE = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _string(v: str) -> str | None:
    if len(v) < 2 or v[0] not in _STRING or v[-1] != v[0]:
        return None
    try:
        value = ast.literal_eval(v)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return v[1:-1]  # an escape Python does not know (Rust's `\u{..}`): its text as written
    return value if isinstance(value, str) else v[1:-1]


# how many openings an object printed over several lines is tried from: a printer puts its members
# deeper than its opening, so the nearest fits; the bound keeps a flood of openings cheap
_MOST_TRIES = 4


def spanning_object(lines: list[str]) -> str | None:
    """The object a pretty printer printed over the last of `lines` (as shown, without colour),
    as one line, when it states a claim field: Rust's `{:#?}` (`Outcome {` ... `}`), Python's
    pprint of a dataclass (`Result(status='done',` ... `       message='...')`), Node's
    util.inspect (`Result {` or `{` ... `}`). Its opening is the nearest line no deeper than its
    last line that starts a named object (deeper ones are its members), and from there the whole
    tail must be that one object; else None. A printer never breaks a string inside, so the lines
    joined by a space hold the same fields."""
    last = lines[-1].rstrip() if lines else ""
    if len(lines) < 2 or not last or last[-1] not in ")]}" or repr_fields(last.strip()) is not None:
        return None
    indent = len(last) - len(last.lstrip())
    tries = 0
    for start in range(len(lines) - 2, -1, -1):
        body = lines[start].lstrip()
        body = _unmarked(body)
        head = _HEAD.match(body) if len(lines[start]) - len(lines[start].lstrip()) <= indent else None
        if head is None or _CLOSE[head.group(3)] != last[-1]:  # (its bracket must close the tail)
            continue
        tries += 1
        if tries > _MOST_TRIES:
            break
        joined = " ".join(ln.strip() for ln in lines[start:])
        fields = repr_fields(joined)
        if fields is not None:
            # the tail is this object: it claims by its fields, or (with none) says nothing more
            return joined if fields else None
    return None
