"""CacheConfig: the tiered cache's settings as one validated object (defaults < CHUNKSTORE_* env < flags).

Invariants: a CacheConfig is valid from construction on (sizes parse, policies are members of
their enums, a host pool given in the same unit as the device pool is not smaller than it) and
immutable; every field has exactly one flag (``--field-name``), one environment variable
(``CHUNKSTORE_FIELD_NAME``) and one entry in docs/CONFIG.md (a test enforces the last).
"""

from __future__ import annotations

import argparse
import enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from chunkstore.cache.policies import Compression, PrefetchPolicy, WritePolicy
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.priority import ThreadPriority
from chunkstore.disk.codec import Codec
from chunkstore.disk.store_spec import DEFAULT_LOCAL_COPY_BYTES, check_index_url, check_object_store
from chunkstore.store_flags import INDEX_URL_HELP, OBJECT_STORE_HELP, SEAL_KEY_HELP
from chunkstore.sizes import GB, SIZE_EXAMPLES, PoolSize, argparse_type, disk_size_gb, gb_or_zero, positive_gb

if TYPE_CHECKING:
    from chunkstore.cache.layout import KVLayout
    from chunkstore.disk.identity import ModelIdentity
    from chunkstore.disk.store_spec import StoreSpec

__all__ = ["CacheConfig", "ENV_PREFIX", "GB", "LIVE_SETTINGS", "PoolSize", "SIZE_EXAMPLES", "add_cli_arguments",
           "env_name", "flag_name"]

ENV_PREFIX = "CHUNKSTORE_"
# Settings that may change while the cache runs (CacheAdmin.reconfigure): each is read afresh at every use.
LIVE_SETTINGS = ("eviction_policy", "prefetch_policy", "prefetch_timeout_s", "write_through_threshold",
                 "disk_load_host_share", "disk_size")
_METAVARS = {"page_size": "TOKENS", "host_ratio": "RATIO", "disk_path": "DIR", "disk_ratio": "RATIO",
             "write_through_threshold": "HITS", "prefetch_timeout_s": "SECONDS",
             "prefetch_host_share": "SHARE", "prefetch_hold_s": "SECONDS"}


def _field(default: Any, description: str, **kwargs: Any) -> Any:
    return Field(default, description=description, **kwargs)


class CacheConfig(BaseSettings):
    """Settings of the device, host and disk tiers. Raises pydantic.ValidationError (a ValueError)
    naming the field and, for a policy, every valid value."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid",
                                      validate_default=True)

    page_size: int = _field(64, "tokens per page (the unit of caching; only full pages are cached)", ge=1)
    device_size: str = _field("1GB", f"device pool size, bytes or pages ({SIZE_EXAMPLES})")
    host_ratio: float = _field(2.0, "host pool pages = host_ratio x device pool pages (ignored "
                                    "when host_size is set)", ge=1.0)
    host_size: str | None = _field(None, f"host pool size, bytes or pages ({SIZE_EXAMPLES}); "
                                         "overrides host_ratio")
    use_disk: bool = _field(True, "keep a disk tier (the chunk store) under the host pool")
    disk_path: Path = _field(Path("chunkstore-data"), "folder of the chunk store")
    index_url: str | None = _field(None, INDEX_URL_HELP)
    object_store: str | None = _field(None, OBJECT_STORE_HELP)
    local_cache_size: float = _field(DEFAULT_LOCAL_COPY_BYTES / GB, "with object_store: the most bytes of local disk (under "
                                           "disk_path) kept as a copy of the shared tier's chunks this "
                                           "server read, so a hot prefix is not fetched over the network "
                                           "each time; a number of GB or a size such as 50GB; 0 = none",
                                     ge=0)
    seal_key_file: Path | None = _field(None, f"{SEAL_KEY_HELP}; the flag is also --seal-key")
    disk_ratio: float | None = _field(None, "disk capacity = disk_ratio x host pool bytes (ignored "
                                            "when disk_size is set)", gt=0)
    disk_size: float | None = _field(None, "disk capacity of stored, compressed chunks: a number of GB "
                                           "(10^9 bytes) or a size such as 500GB; overrides disk_ratio; "
                                           "neither = unbounded", gt=0)
    write_policy: WritePolicy = _field(WritePolicy.WRITE_THROUGH, "when device pages are copied "
                                       "down to host and disk")
    write_through_threshold: int = _field(2, "hits before a page is written through under "
                                             "write_through_selective", ge=1)
    prefetch_policy: PrefetchPolicy = _field(PrefetchPolicy.BEST_EFFORT, "how long a request waits "
                                             "for disk->host prefetch")
    prefetch_timeout_s: float = _field(1.0, "longest prefetch wait under the timeout policy, "
                                            "in seconds", gt=0)
    prefetch_host_share: float = _field(0.5, "share of the host pool that pages prefetched for queued "
                                             "requests may hold, kept from eviction until their request "
                                             "starts (0: no prefetch before a request starts)", ge=0.0, le=1.0)
    prefetch_hold_s: float = _field(30.0, "longest a prefetched page is kept for a request that has not "
                                          "started, in seconds", gt=0)
    compression: Compression = _field(Compression.AUTO, "chunk payload codec (auto: zstd_split for "
                                      "dtypes of 2 or more bytes, zstd for 1-byte ones)")
    disk_load_host_share: float = _field(1.0, "share of the pages loaded from disk to the device "
                                              "that also stay in host memory (the first ones of the "
                                              "prefix)", ge=0.0, le=1.0)
    eviction_policy: EvictionPolicy = _field(EvictionPolicy.LRU, "which unlocked leaf a full tier "
                                             "evicts first")
    background_priority: ThreadPriority = _field(ThreadPriority.IDLE, "CPU priority of the copies no "
                                                 "request waits for (backups, persists, the store's "
                                                 "compression and writes): normal, low (nice 19) or idle "
                                                 "(SCHED_IDLE: only cycles nothing else wants)")

    # -- validation ------------------------------------------------------------------------------

    @field_validator("write_policy", "prefetch_policy", "compression", "eviction_policy", "background_priority",
                     mode="before")
    @classmethod
    def _parse_policy(cls, value: Any, info: ValidationInfo) -> enum.Enum:
        enum_type = cls.model_fields[info.field_name].annotation
        return enum_type.parse(value)  # its ValueError lists the valid values

    @field_validator("device_size", "host_size", mode="before")
    @classmethod
    def _parse_size(cls, value: Any) -> str | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # an empty CHUNKSTORE_HOST_SIZE means "not set"
        PoolSize.parse(value)
        return str(value).strip()  # an int (a number of bytes) is kept as its text

    @field_validator("disk_ratio", "disk_size", "index_url", "object_store", "seal_key_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("index_url")
    @classmethod
    def _check_index_url(cls, value: str | None) -> str | None:
        return None if value is None else check_index_url(value)  # its ValueError names the backends

    @field_validator("object_store")
    @classmethod
    def _check_object_store(cls, value: str | None) -> str | None:
        return None if value is None else check_object_store(value)

    @field_validator("disk_size", "local_cache_size", mode="before")
    @classmethod
    def _parse_disk_size(cls, value: Any) -> Any:
        return disk_size_gb(value)  # '500GB' -> 500.0; a plain number is GB

    @model_validator(mode="after")
    def _check_sizes(self) -> "CacheConfig":
        if self.host_size is not None:
            device, host = self.device_size_spec, self.host_size_spec
            if (device.num_bytes is not None and host.num_bytes is not None
                    and host.num_bytes < device.num_bytes) or \
               (device.num_pages is not None and host.num_pages is not None
                    and host.num_pages < device.num_pages):
                raise ValueError(f"host_size {self.host_size} is smaller than device_size {self.device_size}")
        return self

    def store_spec(self, identity: ModelIdentity) -> StoreSpec | None:
        """The disk tier of ``identity`` as the one door opens it (None when ``use_disk`` is off):
        its own store in the data folder ``disk_path`` (``store_root``: the folder serves any
        model), with this config's capacity, codec, priority, index and bucket, and a local copy
        of the bucket's chunks of ``local_cache_size``."""
        if not self.use_disk:
            return None
        from chunkstore.cache.layout import KVLayout
        from chunkstore.disk.seal_keys import seal_key_provider
        from chunkstore.disk.store_folder import store_root
        from chunkstore.disk.store_spec import StoreSpec

        layout = KVLayout.from_identity(identity)
        return StoreSpec(store_root(self.disk_path, identity), index_url=self.index_url,
                         object_store=self.object_store, local_copy_bytes=self.local_copy_bytes,
                         capacity_bytes=self.disk_capacity_bytes(layout), codec=self.codec_for(layout),
                         background_priority=self.background_priority,
                         seal_key=seal_key_provider(self.seal_key_file))

    @property
    def local_copy_bytes(self) -> int:
        return int(self.local_cache_size * GB)

    # -- derived sizes ---------------------------------------------------------------------------

    @property
    def device_size_spec(self) -> PoolSize:
        return PoolSize.parse(self.device_size)

    @property
    def host_size_spec(self) -> PoolSize | None:
        return PoolSize.parse(self.host_size) if self.host_size is not None else None

    def device_pages(self, layout: KVLayout) -> int:
        """Pages in the device pool. Raises ValueError when not even one page fits."""
        pages = self.device_size_spec.to_pages(layout)
        if pages < 1:
            raise ValueError(f"device_size {self.device_size} holds no page of {layout.page_size_bytes} bytes")
        return pages

    def host_pages(self, layout: KVLayout) -> int:
        """Pages in the host pool: host_size, else host_ratio x device pages (rounded down).
        Raises ValueError when it is smaller than the device pool (write-through needs room for
        every device page)."""
        device = self.device_pages(layout)
        spec = self.host_size_spec
        host = spec.to_pages(layout) if spec is not None else int(self.host_ratio * device)
        if host < device:
            raise ValueError(f"host pool ({host} pages) is smaller than the device pool ({device} pages)")
        return host

    def disk_capacity_bytes(self, layout: KVLayout) -> int | None:
        """The store's capacity in stored bytes: disk_size GB, else disk_ratio x host pool bytes,
        else None (unbounded). Meaningless when use_disk is false."""
        if self.disk_size is not None:
            return int(self.disk_size * GB)
        if self.disk_ratio is not None:
            return int(self.disk_ratio * self.host_pages(layout) * layout.page_size_bytes)
        return None

    def codec_for(self, layout: KVLayout) -> Codec:
        """The store codec for pages of ``layout``."""
        return self.compression.codec_for(layout.itemsize_bytes)

    # -- command line ----------------------------------------------------------------------------

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "CacheConfig":
        """Settings from flags added by ``add_cli_arguments``: a flag given wins over its
        environment variable, which wins over the default. Raises pydantic.ValidationError."""
        given = {name: getattr(args, name) for name in cls.model_fields if hasattr(args, name)}
        return cls(**given)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _display_default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return f"./{value}"
    return str(value)


def help_text(description: str, env: str, default: str) -> str:
    """A flag's help: its description, its variable and one default (a description that already
    says what the default is keeps its own)."""
    if "default" in description:
        return f"{description} (env {env})"
    return f"{description} (env {env}, default {default})"


def _size_arg(text: str) -> str:
    PoolSize.parse(text)
    return text.strip()


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per CacheConfig field to ``parser``. Unset flags leave no attribute (so the
    environment and defaults apply in ``CacheConfig.from_cli_args``)."""
    group = parser.add_argument_group("cache", "tiered KV cache settings (docs/CONFIG.md)")
    for name, info in CacheConfig.model_fields.items():
        kwargs: dict[str, Any] = dict(dest=name, default=argparse.SUPPRESS,
                                      help=help_text(info.description, env_name(name), _display_default(info.default)))
        if name in _METAVARS:
            kwargs["metavar"] = _METAVARS[name]
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):  # each has parse()
            values = ",".join(member.value for member in annotation)
            kwargs.update(type=argparse_type(annotation.parse), metavar="{" + values + "}")
        elif name in ("device_size", "host_size"):
            kwargs.update(type=argparse_type(_size_arg), metavar="SIZE")
        elif annotation is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        elif annotation is int:
            kwargs.update(type=int)
        elif name == "disk_size":
            kwargs.update(type=argparse_type(positive_gb), metavar="GB|SIZE")
        elif name == "local_cache_size":
            kwargs.update(type=argparse_type(gb_or_zero), metavar="GB|SIZE")
        elif annotation in (float, float | None):
            kwargs.update(type=float)
        elif annotation is Path:
            kwargs.update(type=Path)
        elif name == "seal_key_file":
            group.add_argument(flag_name(name), "--seal-key", type=Path, metavar="PATH", **kwargs)
            continue
        elif name in ("index_url", "object_store"):
            kwargs.update(metavar="URL")
        else:  # a new field must choose its flag type here
            raise TypeError(f"no flag type for {name}: {annotation}")
        group.add_argument(flag_name(name), **kwargs)
