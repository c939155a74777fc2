"""The KV caching systems ``chunkstore bench vllm`` runs side by side, each as a vLLM user would set
it up: vLLM alone, vLLM's ``ExampleConnector`` (whole prompts on disk), vLLM's
``OffloadingConnector`` (host memory with its file tier), LMCache (host memory and local disk)
and the chunkstore connector.

Invariants: a system is a closed set of names (``System``); each gets the same host-memory budget
where it has a host tier, no bound on disk, and a data folder of its own (what is measured as bytes
and files on disk); nothing here imports vLLM or a system's package (the child process does).
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

CHUNKSTORE_MODULE = "chunkstore.integrations.vllm"  # reached through vLLM's KVTransferConfig only
LMCACHE_DISK_GB = 100.0  # LMCache's local disk needs a bound: far above what a run writes


class System(str, enum.Enum):
    """A system under test, in the order ``--systems`` lists them by default."""

    VLLM = "vllm"
    EXAMPLE = "example"
    OFFLOADING = "offloading"
    LMCACHE = "lmcache"
    CHUNKSTORE = "chunkstore"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def package(self) -> str | None:
        """The package beyond vLLM it needs (an optional install), or None."""
        return "lmcache" if self is System.LMCACHE else None

    def missing_package(self) -> str | None:
        """Why it cannot run in this interpreter (its package is not installed), or None."""
        if self.package is None or importlib.util.find_spec(self.package) is not None:
            return None
        return f"{self.package} is not installed in this environment (pip install {self.package})"

    @classmethod
    def parse_list(cls, text: str) -> list["System"]:
        """``vllm,example,...`` in the given order; ValueError lists the valid names. vLLM alone is
        the baseline of every ratio, so it is always run (added first when not named)."""
        names = [t.strip() for t in text.split(",") if t.strip()]
        valid = ", ".join(s.value for s in cls)
        systems: list[System] = []
        for name in names:
            try:
                system = cls(name)
            except ValueError:
                raise ValueError(f"--systems: unknown system {name!r}; valid: {valid}") from None
            if system in systems:
                raise ValueError(f"--systems names {name!r} twice")
            systems.append(system)
        if not systems:
            raise ValueError(f"--systems is empty; valid: {valid}")
        return systems if System.VLLM in systems else [System.VLLM, *systems]


_DESCRIPTIONS = {
    System.VLLM: "vLLM alone, its own prefix cache",
    System.EXAMPLE: "vLLM's ExampleConnector: each whole prompt's KV in safetensors files, one per layer",
    System.OFFLOADING: "vLLM's OffloadingConnector: host memory (TieringOffloadingSpec) and its file tier",
    System.LMCACHE: "LMCache's LMCacheConnectorV1: host memory and local disk",
    System.CHUNKSTORE: "the chunkstore connector: host memory and its disk tier",
}


@dataclass(frozen=True, slots=True)
class Budget:
    """What every system gets alike: vLLM's block size and a host-memory tier of ``host_bytes``;
    and where vLLM runs, for the settings a user picks by platform."""

    block_size: int
    host_bytes: int
    is_cpu: bool = False  # vLLM runs on the CPU platform (no device of its own)
    background_priority: str | None = None  # chunkstore's writer; None: the connector's default


@dataclass(frozen=True, slots=True)
class SystemSetup:
    """How one system's engine is configured: ``KVTransferConfig``'s fields (None: no connector),
    the environment its process needs, and the folder it keeps KV in (None: memory only)."""

    transfer: dict | None
    env: dict[str, str] = field(default_factory=dict)
    data: Path | None = None


def setup_for(system: System, folder: Path, budget: Budget) -> SystemSetup:
    """``system``'s configuration, its KV kept under ``folder`` (made here when it keeps any)."""
    if system is System.VLLM:
        return SystemSetup(None)
    folder.mkdir(parents=True, exist_ok=True)
    base = {"kv_role": "kv_both"}
    if system is System.EXAMPLE:
        return SystemSetup({**base, "kv_connector": "ExampleConnector",
                            "kv_connector_extra_config": {"shared_storage_path": str(folder)}}, data=folder)
    if system is System.OFFLOADING:
        # What vLLM documents for host memory plus a disk that outlives the process: the tiering
        # spec, its CPU tier first and the file system tier behind it.
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": budget.host_bytes,
                 "block_size": budget.block_size, "secondary_tiers": [{"type": "fs", "root_dir": str(folder)}]}
        return SystemSetup({**base, "kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra},
                           data=folder)
    if system is System.LMCACHE:
        env = {"LMCACHE_CHUNK_SIZE": str(budget.block_size), "LMCACHE_LOCAL_CPU": "True",
               "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{budget.host_bytes / 2**30:.6f}",  # LMCache's GB are GiB
               "LMCACHE_LOCAL_DISK": f"file://{folder}/", "LMCACHE_MAX_LOCAL_DISK_SIZE": f"{LMCACHE_DISK_GB:g}",
               # Its keys use Python's hash() unless vLLM's is found: LMCache asks for a fixed
               # seed wherever KV is to be found again by another process (a restart).
               "PYTHONHASHSEED": "0", "LMCACHE_DISABLE_BANNER": "1"}
        return SystemSetup({**base, "kv_connector": "LMCacheConnectorV1"}, env=env, data=folder)
    extra = {"disk_path": str(folder), "host_size": str(budget.host_bytes)}
    if budget.is_cpu:
        # On the CPU vLLM's "device" is host memory and the forward takes the cores: a background
        # load only holds its request back a step. Measured here (8 clients x 3 rounds, first run
        # against vLLM alone): throughput 1.03-1.13x with asynchronous loads, 1.22x without.
        extra["async_load"] = False
    if budget.background_priority:
        extra["background_priority"] = budget.background_priority
    return SystemSetup({**base, "kv_connector": "ChunkstoreConnector", "kv_connector_module_path": CHUNKSTORE_MODULE,
                        "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}, data=folder)
