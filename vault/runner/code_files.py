"""The vault's own code, and the hooks every Python process runs at start, as an agent left them.

Why: an unjailed agent runs as the user who owns the checkout or the virtualenv vaultsim runs
from. One that changed a module of the `vault` package, or put a `sitecustomize.py` on the
interpreter's path or a `.pth` file in its site-packages (each line starting with `import` runs
in every Python process that starts), would have its code run by the next daemon, keeper and
runner: the vault would be the agent's. Nothing did look. In a jail the host's files are
read-only.

What is looked at: every file below the `vault` package's directory, and, in every directory of
`sys.path`, `sitecustomize.py` and `usercustomize.py`, and in the site-packages directories the
`.pth` files, each known by (inode, size, mtime, ctime): ctime cannot be set back (`touch -d`
sets mtime only). Python itself writes bytecode caches below the package while a trial runs
(`__pycache__/*.pyc`, for a module first imported then), so a cache file that changed is
accepted when its code is its source's, compiled again here; a cache whose code is not (a
forged `.pyc` carrying its source's time and size, which Python would load without reading the
source) is named. A change to a third-party package's own code is not looked for.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import marshal
import os
import re
import site
import sys
from pathlib import Path

from vault import regular
from vault.resources import IMPORT_ROOT

Sig = tuple[int, int, int, int]
HOOKS = ("sitecustomize.py", "usercustomize.py")
PYC_HEADER = 16  # magic, flags, source mtime and size (PEP 552)
BYTES_MOST = 16 << 20  # a module is at most a few hundred KiB; past this TooLarge: named


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    return dirs


def look() -> dict[str, Sig]:
    """path -> (inode, size, mtime_ns, ctime_ns) of each file looked at (module doc)."""
    out: dict[str, Sig] = {}
    for base, dirs, files in os.walk(IMPORT_ROOT / "vault"):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(base, d))]
        for name in files:
            _sig(os.path.join(base, name), out)
    for d in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        for name in HOOKS:
            _sig(os.path.join(d, name), out)
    for d in _site_dirs():
        with contextlib.suppress(OSError):
            for name in os.listdir(d):
                if name.endswith(".pth"):
                    _sig(os.path.join(d, name), out)
    return out


def _sig(path: str, out: dict[str, Sig]) -> None:
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        out[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed(was: dict[str, Sig], now: dict[str, Sig]) -> list[str]:
    """The files made, changed or removed between two looks, less bytecode caches Python wrote
    from their own sources."""
    out = []
    for path in sorted(set(was) | set(now)):
        if was.get(path) == now.get(path):
            continue
        if Path(path).parent.name == "__pycache__":
            # Python loads only `.pyc` there (its writer's temp files, `X.pyc.NNN`, never), and
            # a cache removed is compiled again from its source
            if not path.endswith(".pyc") or path not in now or _cache_of_its_source(path):
                continue
        out.append(path)
    return out


def _cache_of_its_source(path: str) -> bool:
    """Is the bytecode cache `path` code that its source compiles to, or one no process of this
    interpreter loads? pytest writes caches of its own beside Python's (`M.cpython-311-pytest-8.4.2.pyc`:
    every module of a distribution that provides a pytest plugin is assertion-rewritten, so a pytest
    process importing the vault package writes one per module it imports), which its import hook
    loads: they are checked against the source as pytest rewrites it."""
    tag = re.escape(sys.implementation.cache_tag)
    name = Path(path).name
    if found := re.fullmatch(rf"([^.]+)\.{tag}-pytest-(.+)\.pyc", name):
        return _rewritten_by_pytest(path, str(Path(path).parent.parent / f"{found.group(1)}.py"), found.group(2))
    if not re.fullmatch(rf"[^.]+\.{tag}(\.opt-\d+)?\.pyc", name):
        return True  # another interpreter's (or no cache name Python reads): never loaded by ours
    try:
        source = importlib.util.source_from_cache(path)
        opt = Path(path).suffixes[-2] if len(Path(path).suffixes) > 2 else ""
        level = int(opt[len(".opt-"):]) if opt.startswith(".opt-") else 0
        # regular files only: a FIFO put in a source's place is never opened to wait for a writer
        code = compile(regular.read_bytes(source, BYTES_MOST), source, "exec", dont_inherit=True, optimize=level)
        cached = marshal.loads(regular.read_bytes(path, BYTES_MOST)[PYC_HEADER:])
    except (OSError, ValueError, SyntaxError, EOFError, TypeError, NotImplementedError):
        return False
    return bool(cached == code)


def _rewritten_by_pytest(path: str, source: str, version: str) -> bool:
    """Is `path` pytest's cache of `source`, as this interpreter's pytest rewrites it? A cache of
    another pytest version, or with no pytest here, is loaded by no process of this interpreter."""
    try:
        import pytest
        from _pytest.assertion.rewrite import rewrite_asserts
    except ImportError:
        return True
    if version != pytest.__version__:
        return True
    try:
        text = regular.read_bytes(source, BYTES_MOST)
        tree = ast.parse(text, filename=source)
        rewrite_asserts(tree, text, source, None)
        code = compile(tree, source, "exec", dont_inherit=True)
        cached = marshal.loads(regular.read_bytes(path, BYTES_MOST)[PYC_HEADER:])
    except (OSError, ValueError, SyntaxError, EOFError, TypeError):
        return False
    return bool(cached == code)
