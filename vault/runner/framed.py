"""A final message drawn in a frame, or printed as a YAML document (docs/agent-contract.md §7).

Frames: a summary shown as a person renders one puts lines that are only a frame around it:
Rich's Panel (`╭─ title ─╮` / `│ done: 3 steps │` / `╰──────╯`, or `╰─ 3 steps ─╯` with a subtitle
set into its border), a table's borders (`└───┴───┘`,
`+-----+`), a horizontal rule under it (`────`, markdown's `---`), a setext heading's underline
(`Done` over `====`). Such a line shows no words: it is no more the final message than a markdown
code fence is, and the line above it is read (its `│` sides are punctuation around the first
word, and a two-cell row `│ Status │ done │` is the `| Status | done |` row the contract reads).

YAML: `print(yaml.safe_dump(summary))` writes one `key: value` line per member, keys sorted, so
`status: done` is rarely the last line (`steps: 3` is). A YAML mapping that ends the output (from
its `---`, or the first line after one that is not YAML) and has a `status` (or a boolean `ok`)
is read as the JSON object it holds, whole, as an indented JSON object is: its `status` as the
line `Status: ...` would be (`status: not done` above a list of steps, each with its own
`result: done`, says not done: its last line alone said done).
"""

from __future__ import annotations

import json
import re

# what a frame is drawn with: the box-drawing block and ASCII's rules and corners
_FRAME = re.compile(r"[\s\u2500-\u257f\-=_*~+|:]+")
# what makes it a line rather than a lone sign: at least three of these
_RULE = re.compile(r"[\u2500-\u257f\-=_*~]")
# a box's sides as a markdown table's `|`
_SIDES = str.maketrans({c: "|" for c in "\u2502\u2503\u2551\u254e\u254f\u2506\u2507\u250a\u250b"})


# a box's bottom border with a caption set into it, as Rich draws a Panel's subtitle
# (`╰──── 3 steps ────╯`): its corners, the border's run on each side, the caption spaced off
_CAPTIONED = re.compile(r"([\u2570\u2514\u2517\u255a\u2558\u2559\u2515\u2516+])([\u2500\u2501\u2550\-])\2* "
                        r"\S.*? \2+([\u256f\u2518\u251b\u255d\u255b\u255c\u2519\u251a+])")
# each bottom-left corner's own bottom-right one
_CORNERS = dict(zip("\u2570\u2514\u2517\u255a\u2558\u2559\u2515\u2516+", "\u256f\u2518\u251b\u255d\u255b\u255c\u2519\u251a+"))


# a GitHub Actions workflow command a job's log shows nothing of: a group's end, a mask, a stop
_QUIET = re.compile(r"::(?:endgroup::|add-mask::.*|stop-commands::.*)")


def is_frame(shown: str) -> bool:
    """Is `shown` (a line as a terminal shows it, without colour) only a frame or a rule, or a
    workflow command the CI log does not show (`::endgroup::` after an agent's output group)?"""
    text = shown.strip()
    if _QUIET.fullmatch(text):
        return True
    boxed = _CAPTIONED.fullmatch(text)
    if boxed and _CORNERS[boxed.group(1)] == boxed.group(3):
        return True  # a panel's subtitle is part of its border: the row above is the message
    return bool(text) and _FRAME.fullmatch(text) is not None and len(_RULE.findall(text)) >= 3


def as_row(text: str) -> str:
    """`text` with a box's sides drawn as markdown's `|` (`│ Status │ done │`: `| Status | done |`)."""
    return text.translate(_SIDES)


# a top-level member (`status: done`, `steps:`), a member's continuation (indented, or a list
# item at the top level, as safe_dump writes a list under its key)
_KEY = re.compile(r"([A-Za-z_][\w.-]*):(?:[ \t]+(.*?))?[ \t]*")
_MORE = re.compile(r"(?:[ \t]+\S|-(?:[ \t]|$)).*")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


def _scalar(value: str) -> str:
    """A member's value as its text: a quoted one unquoted (`'not done: denied'`, safe_dump quotes
    a value holding `: `), a plain one without its comment."""
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            text = json.loads(value)
        except ValueError:
            return value[1:-1]
        return text if isinstance(text, str) else value[1:-1]
    return re.sub(r"[ \t]+#.*$", "", value)


def yaml_object(shown: list[str]) -> str | None:
    """The YAML mapping the last of `shown` (lines as shown, each showing something) print, as a
    JSON line, when it names a claim: a `status`, or a boolean `ok`; else None. The
    mapping is the run of YAML lines that ends the output, after its `---` (only the last document
    counts), the last line that is not YAML, or a member named again (a log's `rt22c: ...` lines,
    or `status: ...` ones, one per step, above it); it needs two members or more."""
    end = len(shown)
    if end and shown[-1].strip() == "...":  # the document's end marker
        end -= 1
    members: dict[str, str | None] = {}
    start = end
    while start > 0:
        line = shown[start - 1].rstrip()
        key = _KEY.fullmatch(line)
        if key is not None:
            if key.group(1) in members:
                break  # a member named again is a line of the log above the mapping
            members[key.group(1)] = key.group(2)
        elif _MORE.fullmatch(line) is None:
            break
        start -= 1
    if start == end or _KEY.fullmatch(shown[start].rstrip()) is None or len(members) < 2:
        return None
    doc: dict[str, object] = {}
    for name, value in reversed(members.items()):
        if name == "ok":
            if value not in _BOOL:
                continue
            doc[name] = _BOOL[value]
        elif value:
            doc[name] = _scalar(value)
    if "status" not in doc and "ok" not in doc:
        return None
    return json.dumps(doc)
