"""`vaultsim run --executor ray`: every trial a Ray task, on whichever node Ray picks.

Ray (the optional extra `vaultsim[ray]`) schedules, ships files and reports
failures; vaultsim adds only what a trial needs:

* **Files.** The selected scenarios' folders, files they reference and the
  `--agent` cwd are staged into one `working_dir` (vault.runner.ship); every
  worker starts in its unpacked copy. Nodes need vaultsim (and Ray) installed,
  sshd for the SSH scenarios and bubblewrap for the jail, nothing of the user's.
* **Resources.** `--ray-resources '{"CPU": 1}'` is what one trial holds while
  it runs (`CPU`, `GPU`, `memory` and any custom resource); default one CPU.
* **Where.** Each trial records the node it ran on (`node`: Ray's node id and
  the host name), and the run header lists the cluster's nodes.
* **Node death.** Ray's own retries are off; when a trial's worker or node
  dies (WorkerCrashedError, NodeDiedError, an object lost with it), the
  driver submits it once more (Ray only schedules on live nodes) and the
  trial records `retried` with why. A second death makes it an ERROR trial:
  never silently dropped, never counted twice.
* **Stopping.** A cancelled trial (Ctrl-C, `-x`) is `ray.cancel`ed: a pending
  task never starts, a running one gets a KeyboardInterrupt that ends its
  trial the way a local Ctrl-C does (vault.runner.ray_worker). `aclose()`
  waits, bounded, for every cancelled task to finish its cleanup before the
  driver disconnects.

Without `--ray-address` (nor `RAY_ADDRESS`), Ray starts a small cluster on
this machine for the run (no dashboard) and stops it at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from vault.errors import BadInput
from vault.runner import ship
from vault.runner.scenario import Case
from vault.runner.trial import Runtime, TrialResult

CANCEL_WAIT_S = 40.0  # cancelled trials finish their teardown within this, else they are force-killed
LOCAL_OBJECT_STORE = 80 * 1024 * 1024  # a trial's result is kilobytes; Ray's minimum is about this


def parse_resources(text: str | None) -> dict[str, Any]:
    """`--ray-resources JSON` as Ray task options; default one CPU per trial."""
    if not text:
        return {"num_cpus": 1}
    try:
        given = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise BadInput(f"--ray-resources: not JSON ({why}); e.g. '{{\"CPU\": 1}}'") from None
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) and
                                              not isinstance(v, bool) and v >= 0 for k, v in given.items()):
        raise BadInput("--ray-resources: give an object of resource names to amounts, e.g. "
                       "'{\"CPU\": 1, \"sshd\": 1}'")
    options: dict[str, Any] = {"num_cpus": given.pop("CPU", 1)}
    if "GPU" in given:
        options["num_gpus"] = given.pop("GPU")
    if "memory" in given:
        options["memory"] = given.pop("memory")
    if given:
        options["resources"] = given
    return options


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BadInput("--executor ray needs Ray: pip install 'vaultsim[ray]'") from None
    return ray


def _retryable(ray: Any) -> tuple[type[BaseException], ...]:
    ex = ray.exceptions
    names = ("WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError",
             "ObjectReconstructionFailedError")
    return tuple(getattr(ex, n) for n in names if isinstance(getattr(ex, n, None), type))


class RayExecutor:
    name = "ray"

    def __init__(self, rt: Runtime, cases: list[Case], *, address: str | None, resources: dict[str, Any],
                 slots: int) -> None:
        self.ray = _ray()
        self.rt, self.cases, self.address, self.options, self.slots = rt, cases, address, resources, slots
        # what every trial's Runtime holds besides this machine's launcher, registry and environment
        self.settings = {f.name: getattr(rt, f.name) for f in dataclasses.fields(Runtime)
                         if f.name not in ("launcher", "registry", "env")}
        self.stage: Path | None = None
        self.inflight: set[Any] = set()
        self.cancelled: set[Any] = set()  # cancelled once already: a second cancel would interrupt its cleanup
        self.task: Any = None
        self.retryable = _retryable(self.ray)

    async def start(self) -> dict[str, Any]:
        ray = self.ray
        self.stage = await asyncio.to_thread(ship.stage, self.cases,
                                             self.rt.agent_cwd if self.rt.agent_command else None)
        await asyncio.to_thread(_reachable, self.address or os.environ.get("RAY_ADDRESS"))
        kw: dict[str, Any] = {}
        if not (self.address or os.environ.get("RAY_ADDRESS")):  # a cluster of our own, small
            kw = {"include_dashboard": False, "object_store_memory": LOCAL_OBJECT_STORE}
        try:
            await asyncio.to_thread(ray.init, address=self.address, runtime_env={"working_dir": str(self.stage)},
                                    logging_level=logging.ERROR, log_to_driver=False, **kw)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise BadInput(f"--executor ray: cannot use the Ray cluster"
                           f"{' at ' + self.address if self.address else ''}: {exc}") from None
        from vault.runner.ray_worker import trial_task
        self.task = ray.remote(max_retries=0)(trial_task)
        nodes = [{"id": n["NodeID"], "host": n.get("NodeManagerHostname", ""),
                  "resources": {k: v for k, v in sorted(n.get("Resources", {}).items())
                                if not k.startswith("node:") and k not in ("memory", "object_store_memory")}}
                 for n in ray.nodes() if n.get("Alive")]
        return {"address": self.address or os.environ.get("RAY_ADDRESS") or "local",
                "nodes": sorted(nodes, key=lambda n: n["id"]), "trial_resources": self.options}

    async def trial(self, case: Case, number: int) -> TrialResult:
        deaths: list[str] = []
        for attempt in (1, 2):
            ref = self.task.options(**self.options).remote(case, number, self.settings)
            self.inflight.add(ref)
            try:
                result: TrialResult = await ref
            except asyncio.CancelledError:
                self.ray.cancel(ref)  # aclose() waits for its cleanup
                self.cancelled.add(ref)
                raise
            except self.retryable as exc:
                self.inflight.discard(ref)
                deaths.append(_first_line(exc))
                continue
            except self.ray.exceptions.RayError as exc:  # e.g. the task could not even start there
                self.inflight.discard(ref)
                return TrialResult(case.id, number, case.expect.verdict, "ERROR", expect=case.expect,
                                   error=f"Ray: {_first_line(exc)}")
            self.inflight.discard(ref)
            if deaths:
                result.summary["retried"] = {"attempts": attempt, "because": deaths[0]}
            return result
        return TrialResult(case.id, number, case.expect.verdict, "ERROR", expect=case.expect,
                           error="its Ray worker died twice: " + "; then ".join(deaths))

    async def aclose(self) -> None:
        ray = self.ray
        try:
            if self.inflight and ray.is_initialized():
                await asyncio.to_thread(self._settle, list(self.inflight))
        finally:
            self.inflight.clear()
            self.cancelled.clear()
            if ray.is_initialized():
                await asyncio.to_thread(ray.shutdown)
            if self.stage is not None:
                shutil.rmtree(self.stage, ignore_errors=True)

    def _settle(self, refs: list[Any]) -> None:
        """Cancel what still runs and wait until each task has cleaned up; force the stragglers."""
        ray = self.ray
        for ref in refs:
            if ref not in self.cancelled:
                ray.cancel(ref)
        deadline = time.monotonic() + CANCEL_WAIT_S
        pending = refs
        while pending and time.monotonic() < deadline:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        for ref in pending:
            ray.cancel(ref, force=True)


def _reachable(address: str | None, timeout_s: float = 10.0) -> None:
    """Ray retries an unreachable cluster for minutes: a host:port that refuses a TCP connection is
    refused at once instead (other forms, `auto` and `ray://`, are left to Ray)."""
    given = address or ""
    host, sep, port = given.rpartition(":")
    if not sep or not port.isdigit() or "://" in given:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise BadInput(f"--executor ray: cannot use the Ray cluster at {address}: nothing answers there "
                       f"({exc.strerror or exc}); start one with `ray start --head` or give --ray-address") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
