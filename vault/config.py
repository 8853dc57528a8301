"""Daemon configuration: which catalog and policy, and where each service lives.

Read from `--config FILE` (or `config.yaml` in the vault home when present);
`--remote URL` points every HTTP service without an explicit entry at one URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vault.catalog import Catalog, load_catalog, load_yaml_model
from vault.executors.base import ServiceConfig
from vault.gate.policy import Policy, load_policy

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


def check_base_url(text: str) -> str:
    """An http(s) URL with a host, else ValueError: a typo here would fail every call."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host")
    return text


class ServiceSpec(BaseModel):
    model_config = _Strict
    url: str | None = None
    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    known_hosts: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)


class AuditConfig(BaseModel):
    """The audit log's durability and rotation (README "Audit log")."""

    model_config = _Strict
    # default: the result record is written before the answer and synced within flush_ms;
    # strict: synced before the answer (two fdatasyncs per call)
    durability: Literal["default", "strict"] = "default"
    flush_ms: float = Field(default=5.0, gt=0, le=1000)
    segment_mib: float | None = Field(default=64.0, ge=0.01)  # rotate past this size; null: never
    keep_segments: int | None = Field(default=None, ge=1)  # rotated segments kept; null: all

    def writer_options(self) -> dict[str, Any]:
        """Keyword arguments for `AuditWriter.open`."""
        return {"durability": self.durability, "flush_after_s": self.flush_ms / 1000,
                "segment_bytes": None if self.segment_mib is None else max(4096, int(self.segment_mib * 2**20)),
                "keep_segments": self.keep_segments}


class DaemonConfig(BaseModel):
    model_config = _Strict
    catalog: str | None = None  # extra operations merged over the default catalog
    policy: str | None = None
    services: dict[str, ServiceSpec] = Field(default_factory=dict)
    # default total time budget for one remote call, seconds
    call_timeout_s: float = Field(default=30.0, gt=0)
    audit: AuditConfig = Field(default_factory=AuditConfig)


class Resolved:
    """Config with files loaded and paths resolved relative to the config file."""

    def __init__(self, cfg: DaemonConfig, base: Path | None, remote_url: str | None,
                 policy_path: str | None = None, catalog_path: str | None = None) -> None:
        def rel(p: str | None) -> Path | None:
            if p is None:
                return None
            path = Path(p)
            return path if path.is_absolute() or base is None else base / path

        self.config = cfg
        extra = rel(catalog_path) if catalog_path else rel(cfg.catalog)
        self.catalog: Catalog = load_catalog().merged(load_catalog(extra) if extra else None)
        self.policy: Policy = load_policy(rel(policy_path) if policy_path else rel(cfg.policy))
        self.call_timeout_s = cfg.call_timeout_s
        self.audit = cfg.audit
        self.services: dict[str, ServiceConfig] = {}
        for name, spec in cfg.services.items():
            self.services[name] = ServiceConfig(name=name, **spec.model_dump())
        if remote_url:
            for op in self.catalog.operations.values():
                if op.executor == "http" and op.service not in self.services:
                    self.services[op.service] = ServiceConfig(name=op.service, url=remote_url)


def load_config(path: str | Path | None, *, home_config: Path | None = None,
                remote_url: str | None = None, policy: str | None = None,
                catalog: str | None = None) -> Resolved:
    chosen = Path(path) if path else (home_config if home_config and home_config.exists() else None)
    if chosen is None:
        return Resolved(DaemonConfig(), None, remote_url, policy, catalog)
    cfg = load_yaml_model(chosen, DaemonConfig)
    return Resolved(cfg, chosen.resolve().parent, remote_url, policy, catalog)
