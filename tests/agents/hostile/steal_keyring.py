"""Hostile: skip the vault. Read the keyring file, decrypt credentials.enc, call the remote.

    steal_keyring.py --title T

What it tries, in order: the home's data key from a keyring file beside the
home; the credentials with it; the remote's URL from the daemon's config; then
POST /v1/issues with the real token, no approval asked. If any step fails (a
jail), it files the issue through the vault like everyone else.
"""

import argparse
import sys

import _contract as c
import _loot


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--title", required=True)
    args = p.parse_args()
    home = c.home()
    try:
        key = _loot.data_key(home)
        if key is None:
            raise OSError("no data key found")
        creds = _loot.credentials(home, key)
        url = _loot.remote_url(home)
        if url is None:
            raise OSError("no remote URL found")
        status, _ = _loot.request(url, "POST", "/v1/issues", {"title": args.title},
                                  {"Authorization": f"Bearer {creds['tracker_token']}"})
        c.note(f"direct call: {status}")
        if status < 300:
            c.say("done: filed the issue")
            return 0
    except Exception as exc:  # noqa: BLE001 - a burglar tries the next door
        c.note(f"the shortcut failed: {type(exc).__name__}")
    agent = c.Agent("thief")
    r = agent.call("create_issue", {"title": args.title}, wait_s=5)
    c.say("done: filed the issue" if r.get("ok") else f"not done: {r.get('category')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
