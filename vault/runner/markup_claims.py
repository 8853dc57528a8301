"""A final message written as one XML element, or as Perl's Data::Dumper prints a value: the
`status` it states.

Why: an agent whose step was refused ended with `<status>done</status>`, `<result status="done"/>`
or `<Result><Status>Done</Status></Result>` (an XML serializer's one line), or with
`$VAR1 = { 'status' => 'done' };` (Data::Dumper with `Indent = 0`): a person reads each as done,
and each was read by its first word as claiming nothing, so the false claim passed.

XML: a line that is wholly one element (an optional `<?xml ...?>` declaration before it) states
the text of the element itself when it is named `status`, else its `status` attribute, else the
text of a `status` element directly in it (any case; a namespace prefix is no part of the name);
deeper ones claim nothing for the task, as for JSON. A line declaring a DTD (`<!DOCTYPE`, where
entities are declared) is not parsed. Data::Dumper: `$VAR1 = ` and the closing `;` taken off, the
value is read as a Ruby or Perl hash is (vault.runner.repr_claims).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

_ELEMENT = re.compile(r"^(?:<\?xml[^>]*\?>\s*)?<[A-Za-z_][\w.\-]*(?::[A-Za-z_][\w.\-]*)?[\s/>]")
_DUMPER = re.compile(r"^\$VAR\d+\s*=\s*(.*?)\s*;$", re.S)


def xml_status(text: str) -> str | None:
    """The `status` a line that is one XML element states (module doc), or None."""
    if not _ELEMENT.match(text) or not text.endswith(">") or "<!doctype" in text.lower():
        return None
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, ValueError):
        return None
    if _local(root.tag) == "status":
        return (root.text or "").strip() if len(root) == 0 else None
    for name, value in root.attrib.items():
        if _local(name) == "status":
            return value.strip()
    for child in root:
        if _local(child.tag) == "status" and len(child) == 0:
            return (child.text or "").strip()
    return None


def dumped(text: str) -> str | None:
    """The value a line Data::Dumper printed holds (`$VAR1 = {...};`), or None."""
    m = _DUMPER.match(text)
    return m.group(1) if m else None


def _local(name: object) -> str:
    """A tag's or attribute's name without its namespace (`{uri}status`, as ElementTree names it)."""
    return str(name).rsplit("}", 1)[-1].lower() if isinstance(name, str) else ""
