"""Red team 44c: an agent with a config file in its home, env overrides and an on-disk catalog cache.

Written from docs/agent-contract.md alone (stdlib), as a CLI tool is written:
* config: defaults, then `~/.config/rt44c/agent.ini` or `~/.rt44c-agent.ini` (configparser; absent
  is fine), then RT44C_AGENT_CONFIG (a file), then env vars RT44C_AGENT_WAIT (block|poll),
  RT44C_AGENT_MARGIN, RT44C_AGENT_CACHE_TTL;
* the vault's `catalog` answer cached between its own runs in ${XDG_CACHE_HOME:-~/.cache}/rt44c
  (falling back to $TMPDIR where that is read-only), one file per vault endpoint and run (a digest
  of VAULTSIM_SOCKET and the run id: another vault or run never reads it), written to a temp file
  in the cache directory and renamed; entries older than an hour pruned;
* the cached catalog checks each step's required params before it is sent (a step missing one is
  not sent), and says which operations are idempotent: an `outcome_unknown` of one of those is
  reconciled by a resend under the same key (section 4 allows it), while attempts remain, else
  by a lookup; every other `outcome_unknown` by a lookup.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402


def settings() -> dict[str, str]:
    conf = {"wait": "block", "margin": "0.8", "cache_ttl": "600"}
    parser = configparser.ConfigParser()
    home = os.path.expanduser("~")
    parser.read([os.path.join(home, ".config", "rt44c", "agent.ini"), os.path.join(home, ".rt44c-agent.ini"),
                 *([os.environ["RT44C_AGENT_CONFIG"]] if os.environ.get("RT44C_AGENT_CONFIG") else [])])
    if parser.has_section("agent"):
        conf.update({k: v for k, v in parser["agent"].items() if k in conf})
    for k in conf:
        conf[k] = os.environ.get(f"RT44C_AGENT_{k.upper()}", conf[k])
    return conf


class CatalogCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        self.dir = os.path.join(base, "rt44c")
        try:
            os.makedirs(self.dir, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.dir, delete=True)
            probe.close()
        except OSError:                    # a read-only home (the jail): the cache in $TMPDIR
            self.dir = os.path.join(tempfile.gettempdir(), "rt44c-cache")
            os.makedirs(self.dir, exist_ok=True)
        ident = f"{os.environ['VAULTSIM_SOCKET']}\0{os.environ.get('VAULTSIM_RUN_ID', '')}"
        self.path = os.path.join(self.dir, "catalog-" + hashlib.sha256(ident.encode()).hexdigest()[:20] + ".json")
        self.prune()

    def prune(self) -> None:
        for name in os.listdir(self.dir):
            p = os.path.join(self.dir, name)
            try:
                if name.startswith("catalog-") and time.time() - os.stat(p).st_mtime > 3600:
                    os.unlink(p)
            except OSError:
                pass

    def get(self) -> dict[str, Any] | None:
        try:
            if time.time() - os.stat(self.path).st_mtime > self.ttl:
                return None
            with open(self.path, encoding="utf-8") as f:
                doc: dict[str, Any] = json.load(f)
                return doc
        except (OSError, ValueError):
            return None

    def put(self, doc: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".catalog-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)


class CachingRunner(lib.Runner):
    def __init__(self, task: dict[str, Any], catalog: dict[str, Any], **kw: Any) -> None:
        super().__init__(task, **kw)
        self.ops = {o["name"]: o for o in catalog.get("operations") or [] if isinstance(o, dict) and "name" in o}

    def run_step(self, step: dict[str, Any], first: dict[str, Any] | None = None) -> str:
        spec = (self.ops.get(step["call"]) or {}).get("params") or {}
        given = step.get("params") or {}
        missing = [p for p, d in spec.items() if isinstance(d, dict) and d.get("required") and p not in given]
        if missing and self.outcome.get(step["id"]) != "done":
            return self.fail(step["id"], f"{step['call']} lacks {', '.join(missing)}; not sent")
        return super().run_step(step, first)

    def settle(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str | None:
        if res.get("category") == "outcome_unknown" and res.get("reconciled") is None \
                and (self.ops.get(step["call"]) or {}).get("idempotent") is True \
                and int(rec.get("attempts", 0)) < lib.MAX_ATTEMPTS and self.left() > 1.5:
            self.log(f"{step['id']}: outcome unknown; an idempotent operation: resending under its key")
            return None
        return super().settle(step, rec, res)


def main() -> int:
    conf = settings()
    task = lib.load_task()
    cache = CatalogCache(float(conf["cache_ttl"]))
    catalog = cache.get()
    if catalog is None:
        v = lib.Vault(os.environ["VAULTSIM_SOCKET"], float(task["deadline"]))
        try:
            catalog = v.rpc("catalog")
        finally:
            v.close()
        cache.put(catalog)
        print(f"catalog fetched ({len(catalog.get('operations') or [])} operations), cached", file=sys.stderr)
    else:
        print("catalog from the cache", file=sys.stderr)
    try:
        runner = CachingRunner(task, catalog, client="rt44c-cache", blocking=conf["wait"] != "poll",
                               margin=float(conf["margin"]))
        final = runner.run_all()
        runner.close()
    except lib.Finish as f:
        final = str(f)
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
