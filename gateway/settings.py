"""Gateway settings: environment variables prefixed ``GATEWAY_`` (or a ``.env`` file), validated at start."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.rate_limit import RateLimit

Transport = Literal["grpc", "system_shm", "cuda_shm", "auto"]
MODEL_VERSION_PATTERN = r"^[1-9][0-9]{0,8}$"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Settings(BaseSettings):
    """Everything the gateway can be configured with."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # Serving
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    # Triton
    triton_grpc_url: str = "127.0.0.1:8001"
    regression_model: str = "text_regression"
    embedding_model: str = "text_embedding"
    request_timeout_s: float = Field(10.0, gt=0, description="deadline of one inference request")
    warmup_timeout_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(0.5, gt=0, le=2.0, description="readiness monitor period")
    retry_after_s: int = Field(1, ge=1, description="Retry-After sent with every 503")

    # Model lifecycle (gateway/lifecycle/): the traffic policy's file, shared by every replica in
    # front of one Triton (None: kept in memory, lost at restart).
    policy_path: Path | None = None
    canary_window_s: float = Field(30.0, gt=0, description="window the canary guard compares over")
    canary_min_requests: int = Field(
        20, ge=1, description="canary requests in the window before the guard judges it"
    )
    canary_min_latency_requests: int = Field(
        100, ge=1, description="requests on each side in the window before p99 is compared"
    )
    canary_max_error_rate_increase: float = Field(
        0.05, ge=0, le=1, description="roll back when canary errors exceed stable's by this share"
    )
    canary_max_p99_ratio: float = Field(
        1.5, ge=1, description="roll back when the canary's p99 exceeds stable's times this"
    )
    canary_p99_slack_s: float = Field(
        0.05, ge=0, description="... and exceeds it by at least this many seconds"
    )
    canary_fallback: bool = Field(
        True, description="retry a request the canary failed on stable (within its deadline)"
    )
    shadow_max_in_flight: int = Field(
        32, ge=1, description="shadow copies in flight at most; more are dropped, never queued"
    )
    unload_drain_timeout_s: float = Field(
        30.0, gt=0, description="longest wait for a version's requests to finish before unload"
    )

    # Admission control (gateway/admission.py): per model, in texts.
    admission_enabled: bool = True
    admission_target_s: float = Field(
        0.1, gt=0, description="in-flight limit = measured drain rate x this (Little's law)"
    )
    admission_max_wait_s: float = Field(
        0.25, gt=0, description="longest expected wait in the admission queue before a refusal"
    )
    admission_min_in_flight: int = Field(8, ge=1, description="floor of the in-flight limit")
    admission_max_in_flight: int | None = Field(
        None,
        ge=1,
        description="ceiling of the in-flight limit; default 2 x the model's max_batch_size",
    )
    admission_max_queue: int | None = Field(
        None, ge=0, description="texts that may wait; default the model's max_batch_size"
    )
    # Per-key rate limit for keys whose entry sets none (requests/s; None: unlimited).
    default_rate_limit: float | None = Field(None, gt=0)
    default_rate_burst: int | None = Field(None, ge=1, description="default: 2 x the rate, >= 1")

    # Limits
    max_texts_per_request: int = Field(512, ge=1)
    max_text_chars: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)

    # Auth: SHA-256 hex digests of API keys, each "digest:scope1+scope2[:rate[/burst]]" (scopes:
    # gateway/auth.py; rate: requests/s, gateway/rate_limit.py).
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    api_keys_file: Path | None = None
    protect_metrics: bool = False

    # Shared-memory transport
    transport: Transport = "grpc"
    shm_region_bytes: int = Field(4 * 1024 * 1024, ge=4096)
    shm_pool_size: int = Field(8, ge=1)
    shm_acquire_timeout_s: float = Field(0.05, ge=0)
    shm_auto_min_bytes: int = Field(
        65_536, ge=0, description="auto: smallest payload (input + output bytes) sent through shm"
    )
    cuda_device_id: int = Field(0, ge=0)
    # Region names start with this stable prefix; stale regions left by a crashed gateway of the
    # same deployment are recognised by it (and by a lock that no live process holds).
    shm_prefix: str = Field("textscore-gw", pattern=r"^[A-Za-z0-9.-]{1,40}$")
    # auto: treat Triton as being on this host even if its URL is not loopback (shared IPC).
    shm_same_host: bool = False

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        for entry in value:
            digest = entry.split(":", 1)[0]
            if not _SHA256.match(digest):
                raise ValueError("each API key entry must be 'sha256hex[:scope+scope]'")
        return value

    @property
    def default_rate_limit_policy(self) -> RateLimit | None:
        """The rate limit of keys whose entry sets none."""
        if self.default_rate_limit is None:
            return None
        burst = self.default_rate_burst or RateLimit.default_burst(self.default_rate_limit)
        return RateLimit(self.default_rate_limit, burst)

    @cached_property
    def key_entries(self) -> list[str]:
        """Key entries from the setting and, if configured, the keys file (one per line, # comments)."""
        entries = list(self.api_keys)
        if self.api_keys_file is not None:
            for line in self.api_keys_file.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    entries.append(line)
        return self._check_keys(entries)
