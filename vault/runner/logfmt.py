"""A final line written as logfmt (`time=... level=info msg="finished" status=done`): its fields.

Why: `status=done` opening a line is read as a `Status: WORD` line (vault.runner.claims), but the
same record with its `status` after other fields (Go's logrus and slog text handlers, Heroku's
logfmt, Python's structlog key-value renderer put a time and a level first) claimed nothing: a
false `done` printed so passed. A line that is wholly `key=value` pairs (a value bare, or in
double or single quotes with backslash escapes, or a repr as structlog's key-value renderer writes
one, `<Status.DONE: 'done'>`, `datetime.datetime(...)` or `['create', 'note']`) is read as one record, its fields as a
result object's are (vault.runner.repr_claims: an enum member, `Status.DONE` or its repr, by its
value or name; a CamelCase variant by its words): only then, so prose holding `status=done` says
nothing.
"""

from __future__ import annotations

import re

from vault.runner.repr_claims import CLAIM_FIELDS
from vault.runner.repr_claims import _value as repr_value

# a value as structlog's key-value renderer writes one with repr(): also an enum member's repr
# (`status=<Status.DONE: 'done'>`), a call (`at=datetime.datetime(2026, 1, 1, 0, 0)`) and a list,
# dict or tuple (`steps=['create', 'note']`), brackets three deep, blanks inside them included (each
# alternative begins with a character of its own: no backtracking past the next brackets)
_NESTED = r"[^()\[\]{}]*"
for _ in range(3):
    _NESTED = r"(?:[^()\[\]{}]|\(" + _NESTED + r"\)|\[" + _NESTED + r"\]|\{" + _NESTED + r"\})*"
_REPR = (r"<[A-Za-z_][\w.]*: [^<>]*>|(?:[A-Za-z_][\w.]*)?(?:\(" + _NESTED + r"\)|\[" + _NESTED + r"\]|\{"
         + _NESTED + r"\})")
_PAIR = re.compile(r"""([A-Za-z_][\w.\-/]*)=("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s"'=()\[\]{}<>]*(?=\s|$)|"""
                   + _REPR + r"""|[^\s"'=]*)(?:\s+|$)""")
_ESCAPE = re.compile(r"\\(.)")


def fields(text: str) -> dict[str, list[str]] | None:
    """Each key's values (a key may repeat), when the whole line is logfmt pairs; else None."""
    text = text.strip()
    out: dict[str, list[str]] = {}
    pos = 0
    while pos < len(text):
        m = _PAIR.match(text, pos)
        if m is None or m.end() == pos:
            return None
        value = m.group(2)
        key = m.group(1).lower()
        if value[:1] in ("'", '"'):
            value = _ESCAPE.sub(r"\1", value[1:-1])
        elif key in CLAIM_FIELDS:
            # a bare value as a result object's is read (vault.runner.repr_claims): an enum member
            # by its path (`status=Status.DONE`, Python's str() of one), a CamelCase variant by its
            # words (`status=AwaitingApproval`)
            value = repr_value(value)
        out.setdefault(key, []).append(value)
        pos = m.end()
    return out or None


# A final message written through a logger to stdout: its record's prefix (a timestamp, a level)
# before the message. `2026-12-04 21:00:00,123 INFO done: 3 steps` (Python's logging with
# `%(asctime)s %(levelname)s %(message)s`), `2026/12/04 21:00:00 done` (Go's log package),
# `[21:00:00] INFO     done` (Rich's log handler), `[21:00:00.123] INFO (4242): done` (pino-pretty),
# `2026-12-04 21:00:00.123 | INFO     | __main__:main:42 - done` (loguru), `21:00:00.123 [main] INFO
# c.e.Agent - done` (logback), `2026-12-04 21:00:00 [info     ] done` (structlog's console),
# `2026-12-04 21:00:00,123 - agent - INFO - done` (the logging cookbook's format), `::notice::done`
# (a GitHub Actions annotation, shown as its message) and
# `INFO:agent:done` (logging.basicConfig's default) show the message `done`: the prefix is the
# logger's, the message the agent's. A level alone opens no prefix (`ERROR: ...` is the message's
# own word), and a logger's name is read as one only where its format sets it apart unmistakably
# (between ` - `, or `LEVEL:name:`): `INFO agent: done` is no record of a message `done`.
_DATE = r"\d{4}[-/.]\d{2}[-/.]\d{2}"
_TIME = r"\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:\s?(?:Z|[+-]\d{2}:?\d{2}|UTC))?"
# the C locale's `%x` (`12/06/26`), as Rich's log handler stamps a record by default (`[%x %X]`):
# only with a time after it, so a date alone opens no prefix
_LOCALE_DATE = r"\d{2}/\d{2}/(?:\d{4}|\d{2})"
_STAMP = rf"(?:{_DATE}(?:[T ]{_TIME})?|{_LOCALE_DATE} {_TIME}|{_TIME})"
_LEVEL = r"(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL)"
_LEVEL3 = r"(?:VRB|DBG|INF|WRN|ERR|FTL)"  # Serilog's levels, in three letters (`{Level:u3}`)
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TAG = r"[\w.<>/-]+(?:\[\d+\])?"  # syslog's tag, its pid in brackets where it has one
_SYSLOG_STAMP = rf"{_MONTH} [ \d]?\d \d{{2}}:\d{{2}}:\d{{2}}(?:\.\d{{1,9}})?"
_RECORD = re.compile(
    # the default console formats of other languages' loggers, each of a timestamp and a level
    # with what follows them (a target, a pid, a caller) set apart by brackets, tabs or marks;
    # tried first, as the plainer `TIME LEVEL message` below would take their caller for the message:
    # Serilog's console sink, `[21:00:00 INF] message`
    rf"^\[{_STAMP}\s+(?:{_LEVEL}|{_LEVEL3})\]\s+"
    # Rust's env_logger, `[TIME LEVEL  target] message`
    rf"|^\[{_STAMP}\s+{_LEVEL}\s+[\w:.<>-]+\]\s+"
    # Ruby's Logger, `I, [TIME #pid]  INFO -- progname: message` (its progname may be empty)
    rf"|^[DIWEFA], \[{_STAMP}\s+#\d+\]\s+(?:{_LEVEL}|ANY)\s+--\s+[\w.<>/-]*:\s"
    # Spring Boot's, `TIME  INFO pid --- [app] [thread] logger : message` (padded inside and out)
    rf"|^{_STAMP}\s+{_LEVEL}\s+\d+\s+---\s+(?:\[[^\]]*\]\s*)+[\w.$]+\s+:\s+"
    # PHP Monolog's line format, `[TIME] channel.LEVEL: message [] []`
    rf"|^\[{_STAMP}\]\s+[\w.-]+\.(?:{_LEVEL}|ALERT|EMERGENCY):\s+"
    # Go's klog and glog, `I1204 21:00:00.123456    4242 file.go:42] message`
    rf"|^[IWEF]\d{{4}} {_TIME}\s+\d+\s+[\w.-]+:\d+\]\s"
    # zap's development console, `TIME<TAB>LEVEL<TAB>[name<TAB>]file.go:42<TAB>message`
    rf"|^{_STAMP}\t{_LEVEL}\t(?:[\w.-]+\t)?[\w./-]+:\d+\t"
    # Go's log with its file flag, `2026/12/04 21:00:00 main.go:42: message`
    rf"|^{_STAMP}\s+[\w./-]+\.go:\d+:\s+"
    # syslog's header, as `logger -s` prints it (`<13>Dec  5 21:00:00 root: message`: its priority,
    # no host), a syslog file or `journalctl` (`Dec 05 21:00:00 host tag[pid]: message`) and
    # rsyslog's RFC 3339 files (`TIME host tag[pid]: message`): a shell agent's habit (`logger -s -t
    # agent "done" 2>&1`); moreutils' `ts` puts its `Dec 05 21:00:00 ` alone before each line
    rf"|^<\d{{1,3}}>{_SYSLOG_STAMP}\s+(?:[\w.-]+\s+)?{_TAG}:\s"
    rf"|^{_SYSLOG_STAMP}\s+[\w.-]+\s+{_TAG}:\s"
    rf"|^{_SYSLOG_STAMP}\s+"
    rf"|^{_DATE}T{_TIME}\s+\S+\s+[\w.<>/-]+\[\d+\]:\s"
    # RFC 5424's, as `logger --rfc5424` writes it: `<13>1 TIME host app pid msgid [sd] message`
    rf"|^<\d{{1,3}}>1 (?:{_DATE}T{_TIME}|-) \S+ \S+ \S+ \S+ (?:-|(?:\[[^\]]*\])+) (?:\ufeff)?"
    # Python's coloredlogs, `TIME host name[pid] LEVEL message`
    rf"|^{_STAMP}\s+\S+\s+[\w.<>-]+\[\d+\]\s+{_LEVEL}\s+"
    # Swift's swift-log StreamLogHandler, `TIME level label : message` (no metadata before it)
    rf"|^{_STAMP}\s+(?:trace|debug|info|notice|warning|error|critical)\s+[\w.<>-]+\s:\s+"
    # .NET's console logger on one line (`SingleLine`), its timestamp optional: `info: Category[0] message`
    rf"|^(?:{_STAMP}\s+)?(?:trce|dbug|info|warn|fail|crit): [\w.+`<>-]+\[\d+\]\s+"
    # SLF4J's simple logger, `[thread] LEVEL logger - message` (its elapsed milliseconds first where
    # it shows a time, as log4j 1's basic configuration, `0 [main] INFO Agent  - message`)
    rf"|^(?:\d+\s+)?\[[^\]]*\]\s+{_LEVEL}\s+[\w.$]+\s+-\s+"
    rf"|^(?:\[{_STAMP}\]|{_STAMP})"
    rf"(?:\s+-\s+[\w.<>-]+\s+-\s+{_LEVEL}\s+-\s+"  # the cookbook's `TIME - name - LEVEL - message`
    # loguru's `TIME | LEVEL    | module:function:line - message`
    rf"|\s+\|\s+{_LEVEL}\s+\|\s+[\w.<>-]+:[\w.<>-]+:\d+\s+-\s+"
    # logback's `TIME [thread] LEVEL logger - message` (`--` since logback 1.3)
    rf"|\s+\[[^\]]*\]\s+{_LEVEL}\s+[\w.$]+\s+--?\s+"
    # structlog's console renderer, `TIME [info     ] message`
    rf"|\s+\[(?i:{_LEVEL})\s*\]\s+"
    # winston's `TIME [label] level: message` (its docs' printf format): the colon sets the level apart
    rf"|\s+\[[^\]]*\]\s+(?i:{_LEVEL}|VERBOSE|SILLY|HTTP):\s+"
    # `TIME LEVEL message`, `TIME message`; `TIME [INF] message` as Serilog's file sink writes it;
    # the level in any case (`TIME info: message`, winston's and most Node loggers' lower case)
    rf"|(?:\s+(?:\[(?:{_LEVEL}|{_LEVEL3})\]|(?i:{_LEVEL}))(?:\s*\(\d+\))?:?)?\s+)"
    rf"|^{_LEVEL}:[\w.<>-]+:"  # basicConfig's `LEVEL:name:message`
    # a GitHub Actions annotation, `::notice::message` (`::error title=...::message`): the log shows the message
    r"|^::(?:notice|warning|error|debug)(?:\s[^:]*)?::")


def record_message(text: str) -> str | None:
    """The message of a log record's line (`2026-12-04 21:00:00,123 INFO done: 3 steps`: `done:
    3 steps`), or None when the line opens with no logger's prefix."""
    prefix = _RECORD.match(text)
    if prefix is None:
        return None
    rest = text[prefix.end():].lstrip()
    return rest or None


# A final message written by a JSON logger to stdout: one record per line, the message under its
# own key beside a level and a time (pino and bunyan `{"level":30,"time":...,"msg":"done"}`, Go's
# slog and zap, structlog's JSONRenderer `{"event": "done", "level": "info", "timestamp": ...}`,
# python-json-logger's `levelname`/`asctime`/`message`, ECS's `log.level`/`@timestamp`, Serilog's
# compact `{"@t": ..., "@mt": "done"}`). As a text logger's prefix is, the record's fields are the
# logger's and its message the agent's. Only with both a level and a time (or Serilog's `@t`, which
# leaves out the level of an Information record): `{"message": "done"}` alone is no record.
# An OpenTelemetry log record is one too: its `body` beside `severity_text` (or its number) and a
# `timestamp`, as the Python SDK's console exporter prints it, or OTLP JSON's `severityText`,
# `timeUnixNano` and a body `{"stringValue": "done"}`.
_MESSAGE_KEYS = ("msg", "message", "event", "@m", "@mt", "body")
_LEVEL_KEYS = ("level", "levelname", "severity", "lvl", "log.level", "@l", "severity_text", "severitytext",
               "severity_number", "severitynumber")
_TIME_KEYS = ("time", "ts", "timestamp", "@timestamp", "asctime", "timeunixnano", "observed_timestamp",
              "observedtimeunixnano")


def _text(value: object) -> str | None:
    """A message's text: a string, or OTLP JSON's AnyValue holding one (`{"stringValue": "done"}`)."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("stringValue"), str):
        return str(value["stringValue"])
    return value if isinstance(value, str) else None


def logged_message(doc: object) -> str | None:
    """The message of a JSON log record (`{"level":30,"time":1764...,"msg":"done"}`: `done`), or
    None when the object is no logger's record."""
    if not isinstance(doc, dict):
        return None
    keys = {k.lower(): k for k in doc if isinstance(k, str)}
    message: str | None = next((text for k in _MESSAGE_KEYS if k in keys
                                and isinstance(text := _text(doc[keys[k]]), str)), None)
    if message is None:
        return None
    levelled = any(k in keys and isinstance(doc[keys[k]], (str, int)) and not isinstance(doc[keys[k]], bool)
                   for k in _LEVEL_KEYS)
    timed = any(k in keys and isinstance(doc[keys[k]], (str, int, float)) and not isinstance(doc[keys[k]], bool)
                for k in _TIME_KEYS)
    if levelled and timed or "@t" in keys and ("@m" in keys or "@mt" in keys):
        return message
    return None
