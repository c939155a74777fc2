"""``chunkstore bench multiturn``: SGLang's multi-turn chat benchmark over cache configurations side by side.

Invariants: every configuration sends the same workload (the questions are a function of the seed;
the replies are greedy) with the same device and host budgets; in-process, each configuration gets
a fresh Engine over the same loaded model, so no state but the disk tier (and only where meant:
``disk-restart`` reopens the folder ``device+host+disk`` left, files made cold first) carries from
one to the next; prompts are token ids, so every length is exact; with --url the page size and the
model come from the server (``GET /get_model_info``), and a --page-size that disagrees is refused;
targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import enum
import math
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from chunkstore.bench.common import exit_on_sigterm, files_under, make_cold
from chunkstore.bench.contention import ForwardCost, store_cpu_s
from chunkstore.bench.multiturn_report import bounds, format_table, summarize_run, targets, write_plot
from chunkstore.bench.workload import Conversation, Reply, Send, Workload, drive
from chunkstore.cache.config import CacheConfig, PoolSize
from chunkstore.cache.layout import KVLayout
from chunkstore.output import add_output_arguments, emit_result, json_safe
from chunkstore.sizes import argparse_type, positive_gb

DEFAULT_PAGE_SIZE = 16  # in-process: fine-grained reuse (a round adds 100 tokens by default)
SERVER_PAGE_SIZE = 64  # with --url: chunkstore serve's default page size
MEMORY_SHARE = 0.25  # device + host pages / all clients' final histories, by default
_UNREACHABLE_HITS = 2**62  # write_through_selective with this threshold never copies a page down
# The defaults of SGLang's benchmark/hicache/bench_multiturn.py (sgl-project/sglang at 028e262) for
# the flags both have, quoted by --help where ours differ (Workload holds ours).
SGLANG_DEFAULTS = {"num_clients": 256, "num_rounds": 5, "request_length": 512, "output_length": 64,
                   "max_parallel": 128, "request_rate": 1.0, "request_rates": "16, 14, ..., 2, 1", "seed": 1}


class Setup(str, enum.Enum):
    """The configurations, in the order they run (disk-restart needs device+host+disk's folder)."""

    NO_CACHE = "no-cache"
    DEVICE = "device"
    DEVICE_HOST = "device+host"
    DEVICE_HOST_DISK = "device+host+disk"
    DISK_RESTART = "disk-restart"
    SERVER = "server"  # --url only: the server as it was started

    @classmethod
    def parse_list(cls, text: str) -> tuple[Setup, ...]:
        """'no-cache,device+host' -> setups in run order. Raises ValueError listing the valid names."""
        chosen = set()
        for name in (n.strip() for n in text.split(",") if n.strip()):
            try:
                chosen.add(cls(name.lower()))
            except ValueError:
                raise ValueError(f"unknown configuration {name!r}; valid: "
                                 f"{', '.join(s.value for s in cls)}") from None
        if not chosen:
            raise ValueError("--configs names no configuration")
        return tuple(s for s in cls if s in chosen)

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Setup.NO_CACHE: "a fresh namespace per request, so nothing ever matches (the cache still does its "
                    "inserts); device pool only",
    Setup.DEVICE: "device pool only: write_through_selective with an unreachable threshold copies "
                  "nothing to the host pool; no disk tier",
    Setup.DEVICE_HOST: "device and host pools, write-through; no disk tier",
    Setup.DEVICE_HOST_DISK: "device and host pools, write-through to the disk tier",
    Setup.DISK_RESTART: "a new Engine over the disk tier device+host+disk left (memory tiers empty, "
                        "files made cold), the same workload again",
    Setup.SERVER: "the server at --url, with the tiers it was started with",
}
IN_PROCESS = tuple(s for s in Setup if s is not Setup.SERVER)
OVER_HTTP = (Setup.NO_CACHE, Setup.SERVER)


@dataclass(slots=True)
class MultiturnConfig:
    """What to run; ValueError names a bad field (the model's own limits are checked once loaded)."""

    workload: Workload = field(default_factory=Workload)
    preset: str = "small"  # a built-in model, used when model_path is None
    model_path: Path | None = None  # a local Hugging Face model folder
    dtype: str = "float32"
    page_size: int | None = None  # None: DEFAULT_PAGE_SIZE in-process, SERVER_PAGE_SIZE with a url
    max_running: int = 1
    torch_threads: int | None = None  # the forward's threads (torch.set_num_threads); None: torch's default
    device_size: str | None = None  # None: derived from the workload (see Budgets)
    host_size: str | None = None
    disk_size_gb: float | None = None  # None: unbounded
    setups: tuple[Setup, ...] = IN_PROCESS
    url: str | None = None
    api_key: str | None = None
    namespace: str | None = None  # --url: None draws a fresh one, so earlier runs do not hit
    keep: Path | None = None
    show_progress: bool = True
    seal_key: Path | None = None  # a key file: the disk configurations run on a sealed store
    page_size_given: bool = field(init=False, default=False)  # --url: a given size must be the server's

    def __post_init__(self) -> None:
        self.page_size_given = self.page_size is not None
        if self.page_size is None:
            self.page_size = SERVER_PAGE_SIZE if self.url else DEFAULT_PAGE_SIZE
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.max_running < 1:
            raise ValueError(f"--max-running must be >= 1, got {self.max_running}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {self.torch_threads}")
        for name in ("device_size", "host_size"):
            if getattr(self, name) is not None:
                PoolSize.parse(getattr(self, name))  # its ValueError names the accepted forms
        if self.disk_size_gb is not None and not self.disk_size_gb > 0:
            raise ValueError(f"--disk-size must be > 0 GB, got {self.disk_size_gb}")
        if not self.setups:
            raise ValueError("--configs names no configuration")
        allowed = OVER_HTTP if self.url else IN_PROCESS
        refused = [s.value for s in self.setups if s not in allowed]
        if refused:
            where = ("with --url only no-cache and server run (the server's tiers are fixed when it starts)"
                     if self.url else "server runs only with --url")
            raise ValueError(f"--configs {','.join(refused)}: {where}")
        if Setup.DISK_RESTART in self.setups and Setup.DEVICE_HOST_DISK not in self.setups:
            raise ValueError("disk-restart replays over the disk tier device+host+disk leaves: run both")
        if self.keep is not None and self.keep.exists() and (not self.keep.is_dir() or any(self.keep.iterdir())):
            raise ValueError(f"--keep {self.keep}: not a new or empty folder")
        if not self.url:
            from chunkstore.engine.loader import parse_dtype
            from chunkstore.engine.presets import get_preset

            parse_dtype(self.dtype)  # its ValueError lists the dtypes
            if self.model_path is not None:
                if not self.model_path.is_dir():
                    raise ValueError(f"--model {self.model_path}: no such folder")
            else:  # a folder's positions are known once it is loaded
                check_fits(self.workload, get_preset(self.preset).max_positions)  # ValueError lists presets

    @property
    def model_name(self) -> str:
        return str(self.model_path) if self.model_path is not None else self.preset


def check_fits(workload: Workload, max_positions: int) -> None:
    """Raises ValueError when a client's last round (its whole history) exceeds the model's positions."""
    if workload.final_history_tokens > max_positions:
        raise ValueError(f"a client's history grows to {workload.final_history_tokens} tokens "
                         f"(rounds x (request + output length)); the model allows {max_positions}")


@dataclass(frozen=True, slots=True)
class Budgets:
    """Device and host pool pages shared by every configuration, and how they were chosen."""

    device_pages: int
    host_pages: int
    history_pages: int  # all clients' final histories, in whole pages
    is_derived: bool

    @property
    def memory_share(self) -> float:
        return (self.device_pages + self.host_pages) / self.history_pages

    @classmethod
    def derive(cls, workload: Workload, page_size: int, max_running: int, layout: KVLayout,
               device_size: str | None, host_size: str | None) -> Budgets:
        """By default device + host = a quarter of all clients' final histories, a third of it on
        the device (host = 2 x device, the host_ratio default) but never less than what stays
        locked there (``max_running + 1`` whole histories: the running requests' hits, and the
        pages of the request that finished last, which its write-through keeps locked until they
        are on disk), and host >= device. Flags win."""
        per_client = math.ceil(workload.final_history_tokens / page_size)
        total = workload.num_clients * per_client
        memory = max(2, round(total * MEMORY_SHARE))
        device = (PoolSize.parse(device_size).to_pages(layout) if device_size
                  else max(math.ceil(memory / 3), (max_running + 1) * per_client))
        host = PoolSize.parse(host_size).to_pages(layout) if host_size else max(memory - device, device)
        if device < 1:
            raise ValueError(f"--device-size {device_size} holds no page of {layout.page_size_bytes} bytes")
        if host < device:
            raise ValueError(f"the host pool ({host} pages) is smaller than the device pool ({device} pages)")
        return cls(device, host, total, device_size is None and host_size is None)

    def cache_config(self, setup: Setup, page_size: int, disk_path: Path, disk_size_gb: float | None,
                     seal_key: Path | None = None) -> CacheConfig:
        """The cache settings of ``setup`` (a disk tier sealed by ``seal_key`` when given); unset
        ones follow CHUNKSTORE_* variables (docs/CONFIG.md)."""
        common = {"page_size": page_size, "device_size": f"{self.device_pages}pages", "disk_path": disk_path}
        if setup in (Setup.NO_CACHE, Setup.DEVICE):
            return CacheConfig(**common, host_size=f"{self.device_pages}pages", use_disk=False,
                               write_policy="write_through_selective", write_through_threshold=_UNREACHABLE_HITS)
        uses_disk = setup in (Setup.DEVICE_HOST_DISK, Setup.DISK_RESTART)
        sealed = {"seal_key_file": seal_key} if uses_disk and seal_key is not None else {}
        return CacheConfig(**common, host_size=f"{self.host_pages}pages", use_disk=uses_disk,
                           write_policy="write_through", disk_size=disk_size_gb if uses_disk else None, **sealed)


# ---- senders -------------------------------------------------------------------------------------

def engine_sender(engine, workload: Workload, *, fresh_namespaces: bool) -> Send:
    """Send as token ids: each question's bytes, then the exact ids of its reply."""
    from chunkstore.engine import Request, SamplingParams
    from chunkstore.disk.keys import DEFAULT_NAMESPACE

    params = SamplingParams(max_tokens=workload.output_length, temperature=0.0, ignore_eos=True, seed=0)

    def send(client: int, round_index: int, conversation: Conversation) -> Reply:
        ids: list[int] = []
        for i, question in enumerate(conversation.questions):
            ids += question.encode()
            if i < len(conversation.replies):
                ids += conversation.replies[i].output_ids
        namespace = f"no-cache-{client}-{round_index}" if fresh_namespaces else DEFAULT_NAMESPACE
        r = engine.generate(Request(token_ids=ids, params=params, namespace=namespace))
        return Reply(text=r.text, output_ids=r.token_ids, prompt_tokens=r.prompt_tokens,
                     completion_tokens=r.completion_tokens, cached_tokens=r.cached_tokens,
                     tier_tokens={"device": r.device_tokens, "host": r.host_tokens, "disk": r.disk_tokens},
                     ttft_s=r.ttft_s, latency_s=r.latency_s, prefill_s=r.prefill_s, forward_s=r.forward_s,
                     queue_s=r.queue_s)

    return send


def chat_sender(client, model: str, workload: Workload, namespace: str, *, fresh_namespaces: bool) -> Send:
    """Send as an OpenAI chat: the questions as user turns, the replies' text as assistant turns."""

    def send(client_id: int, round_index: int, conversation: Conversation) -> Reply:
        messages: list[dict] = []
        for i, question in enumerate(conversation.questions):
            messages.append({"role": "user", "content": question})
            if i < len(conversation.replies):
                messages.append({"role": "assistant", "content": conversation.replies[i].text})
        user = f"{namespace}-{client_id}-{round_index}" if fresh_namespaces else namespace
        return client.chat(model, messages, max_tokens=workload.output_length, user=user)

    return send


def _progress(cfg: MultiturnConfig, desc: str) -> tqdm:
    return tqdm(total=cfg.workload.num_requests, desc=desc, unit="req", file=sys.stderr, leave=False,
                dynamic_ncols=True, disable=not cfg.show_progress or not sys.stderr.isatty())


# ---- runs ----------------------------------------------------------------------------------------

def _warm_up(loaded, cfg: MultiturnConfig, work: Path) -> None:
    """One long request on a throwaway engine, so the first configuration pays no first-run costs."""
    from chunkstore.engine import Engine, Request, SamplingParams

    w = cfg.workload
    pages = math.ceil(w.final_history_tokens / cfg.page_size) + 1
    config = CacheConfig(page_size=cfg.page_size, device_size=f"{pages}pages", use_disk=False,
                         disk_path=work / "warm-up")
    with Engine(loaded, config) as engine:
        prompt = list(range(97, 123)) * (w.prompt_tokens(w.num_rounds - 1) // 26 + 1)
        engine.generate(Request(token_ids=prompt[:w.prompt_tokens(w.num_rounds - 1)],
                                params=SamplingParams(max_tokens=2, ignore_eos=True)))


def run_in_process(cfg: MultiturnConfig, work: Path) -> dict:
    from chunkstore.engine import Engine, EngineConfig, load_model

    w = cfg.workload
    if cfg.torch_threads is not None:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    loaded = load_model(cfg.model_path or cfg.preset, dtype=cfg.dtype)
    check_fits(w, loaded.max_positions)
    identity = loaded.identity(cfg.page_size)
    layout = KVLayout.from_identity(identity)
    budgets = Budgets.derive(w, cfg.page_size, cfg.max_running, layout, cfg.device_size, cfg.host_size)
    _warm_up(loaded, cfg, work)
    engine_config = EngineConfig(max_queue_size=max(64, w.max_parallel), max_running_requests=cfg.max_running)
    store = work / "store"
    bytes_per_token = layout.page_size_bytes / cfg.page_size
    measured = []
    for setup in cfg.setups:
        extra: dict = {"device_pages": budgets.device_pages,
                       "host_pages": budgets.host_pages if setup not in (Setup.NO_CACHE, Setup.DEVICE) else 0,
                       "uses_disk": setup in (Setup.DEVICE_HOST_DISK, Setup.DISK_RESTART)}
        if setup is Setup.DISK_RESTART:
            extra["cold_method"] = make_cold(files_under(store))
        engine = Engine(loaded, budgets.cache_config(setup, cfg.page_size, store, cfg.disk_size_gb, cfg.seal_key), engine_config)
        engine.cache.wait_prefaulted()  # every configuration starts with its pools mapped
        try:
            with _progress(cfg, setup.value) as bar:
                result = drive(w, engine_sender(engine, w, fresh_namespaces=setup is Setup.NO_CACHE),
                               on_reply=lambda _: bar.update())
            engine.cache.wait_idle(60)  # the copies the run queued (write-through) count in its figures
            stats = engine.stats()
            cpu = store_cpu_s() if extra["uses_disk"] else None  # before close joins the store's threads
        finally:
            engine.close()  # flushes the disk tier: disk-restart starts from what was written
        measured.append((setup, result, stats, extra, cpu))
    # The forward alone, uncontended: fitted on the no-cache run, the baseline of every other one.
    cost = next((ForwardCost.fit([rec.reply for rec in result.records])
                 for setup, result, *_ in measured if setup is Setup.NO_CACHE), None)
    runs = [summarize_run(setup.value, setup.description, result, stats, page_size=cfg.page_size,
                          bytes_per_token=bytes_per_token, extra=extra, forward_cost=cost, store_cpu_s=cpu)
            for setup, result, stats, extra, cpu in measured]
    memory = f"device {budgets.device_pages} + host {budgets.host_pages} pages = {budgets.memory_share:.2f} of " \
             f"the final histories ({budgets.history_pages} pages{', derived' if budgets.is_derived else ''})"
    disk = f"{cfg.disk_size_gb:g} GB" if cfg.disk_size_gb else "unbounded"
    if cfg.seal_key is not None:
        disk += ", sealed"
    return {
        "mode": "in-process",
        "sealed": cfg.seal_key is not None,
        "model": {"name": cfg.model_name, "model_id": loaded.model_id, "dtype": loaded.dtype_name,
                  "device": str(loaded.device), "page_size_bytes": layout.page_size_bytes,
                  "kv_bytes_per_token": bytes_per_token},
        "budgets": {"page_size": cfg.page_size, "device_pages": budgets.device_pages,
                    "host_pages": budgets.host_pages, "history_pages": budgets.history_pages,
                    "memory_share": budgets.memory_share, "is_derived": budgets.is_derived,
                    "device_bytes": budgets.device_pages * layout.page_size_bytes,
                    "host_bytes": budgets.host_pages * layout.page_size_bytes, "disk_size_gb": cfg.disk_size_gb,
                    "max_running": cfg.max_running},
        "runs": runs,
        "setting": f"model {cfg.model_name} ({loaded.dtype_name}, {loaded.device}), page {cfg.page_size} tokens "
                   f"({layout.page_size_bytes / 1024:g} KiB); {memory}; disk {disk}; "
                   f"{cfg.max_running} running request(s) at a time; forward on {torch_threads()} thread(s)",
    }


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def server_page_size(cfg: MultiturnConfig, served) -> int:
    """The server's page size (``served``: its ServerModel). Raises ValueError naming both when
    --page-size was given and differs: the ideal hit rate is only right at the server's pages."""
    if cfg.page_size_given and cfg.page_size != served.page_size:
        raise ValueError(f"--page-size {cfg.page_size} disagrees with the server's page size "
                         f"{served.page_size} (GET /get_model_info of {cfg.url}); leave it out to use the server's")
    return served.page_size


def run_over_http(cfg: MultiturnConfig) -> dict:
    from chunkstore.bench.chat_client import ChatClient

    w = cfg.workload
    client = ChatClient(cfg.url, api_key=cfg.api_key)
    served = client.model_info()
    page_size = server_page_size(cfg, served)
    if served.max_positions is not None:
        check_fits(w, served.max_positions)
    model = served.name
    namespace = cfg.namespace or f"bench-{secrets.token_hex(4)}"
    runs = []
    for setup in cfg.setups:
        with _progress(cfg, setup.value) as bar:
            result = drive(w, chat_sender(client, model, w, namespace, fresh_namespaces=setup is Setup.NO_CACHE),
                           on_reply=lambda _: bar.update())
        runs.append(summarize_run(setup.value, setup.description, result, None, page_size=page_size,
                                  bytes_per_token=None, extra={"namespace": namespace}))
    return {"mode": "url", "url": cfg.url,
            "model": {"name": model, "model_id": served.model_id, "max_positions": served.max_positions},
            "budgets": {"page_size": page_size},
            "runs": runs, "setting": f"server {cfg.url}, model {model}, namespace {namespace}, ideal at "
                                     f"{page_size}-token pages"}


def run_multiturn_bench(cfg: MultiturnConfig) -> dict:
    """Every configuration, then the targets; returns the dict the table, the JSON and the plot show.
    Raises RuntimeError when a request fails, ValueError when the model cannot hold the workload."""
    started = time.perf_counter()
    work = cfg.keep if cfg.keep is not None else Path(tempfile.mkdtemp(prefix="chunkstore-bench-multiturn-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run_over_http(cfg) if cfg.url else run_in_process(cfg, work)
    finally:
        if cfg.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    w = cfg.workload
    rate = "no gaps" if math.isinf(w.request_rate) else f"{w.request_rate:g} req/s Poisson"
    result["header"] = (f"chunkstore bench multiturn: {w.num_clients} clients x {w.num_rounds} rounds, "
                        f"{w.request_length} + {w.output_length} tokens a round, at most {w.max_parallel} in "
                        f"flight, {rate}, seed {w.seed}\n{result.pop('setting')}")
    result["workload"] = asdict(w)
    checks = targets(result["runs"])
    result["targets"] = {t.name: t.to_dict() for t in checks}
    result["all_pass"] = all(t.passed for t in checks)
    result["bounds"] = bounds(result["runs"])
    result["runtime_s"] = time.perf_counter() - started
    return result


# ---- command line --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench multiturn``."""
    # Where SGLang's benchmark/hicache/bench_multiturn.py has the same flag, the default is its own
    # or the help says how and why ours differs (the sizes: a run must fit a 2-core CPU in minutes).
    d, sg = Workload(), SGLANG_DEFAULTS
    parser.add_argument("--num-clients", type=int, default=d.num_clients,
                        help=f"conversations, each a client (default {d.num_clients}; SGLang's "
                             f"{sg['num_clients']}, sized for a GPU server: on a CPU each configuration would "
                             f"take hours)")
    parser.add_argument("--num-rounds", type=int, default=d.num_rounds,
                        help=f"requests per client (default {d.num_rounds}, as SGLang's)")
    parser.add_argument("--request-length", type=int, default=d.request_length,
                        help=f"tokens of each new question (default {d.request_length}; SGLang's "
                             f"{sg['request_length']}: a CPU prefills ~1k tokens a second on the small preset)")
    parser.add_argument("--output-length", type=int, default=d.output_length,
                        help=f"tokens of each reply (default {d.output_length}; SGLang's {sg['output_length']}: "
                             f"here one decoded token costs ~20 prompt tokens of prefill, so long replies "
                             f"would bury what the cache saves; see docs/CLI.md)")
    parser.add_argument("--max-parallel", type=int, default=d.max_parallel,
                        help=f"requests in flight at most (default {d.max_parallel}; SGLang's "
                             f"{sg['max_parallel']}: the engine here runs --max-running requests at once, "
                             f"the rest queue)")
    parser.add_argument("--request-rate", type=float, default=d.request_rate,
                        help=f"requests per second, Poisson; inf for no gaps (default {d.request_rate:g}: the "
                             f"first rate of SGLang's sweep, which runs {sg['request_rates']} unless "
                             f"--disable-auto-run; one rate per invocation here)")
    parser.add_argument("--seed", type=int, default=d.seed,
                        help=f"seed of the questions and gaps (default {d.seed}, as SGLang's; the questions "
                             f"are ASCII words of our own, not SGLang's samples, so the same seed sends other text)")
    parser.add_argument("--configs", default=None,
                        help="configurations to run, comma-separated (default: all five; with --url: server)")
    parser.add_argument("--preset", default="small",
                        help="built-in model when --model is not given: tiny, small, llama-1b (sized for a GPU) "
                             "(default small)")
    parser.add_argument("--model", type=Path, default=None, metavar="PATH",
                        help="a local Hugging Face model folder (default: the preset)")
    parser.add_argument("--dtype", default="float32", help="model and KV dtype (default float32)")
    parser.add_argument("--page-size", type=int, default=None,
                        help=f"tokens per page (default {DEFAULT_PAGE_SIZE}, not serve's {SERVER_PAGE_SIZE}: a round "
                             f"adds ~100 tokens, and smaller pages show that reuse; with --url the server's "
                             f"page size, for the ideal hit rate)")
    parser.add_argument("--max-running", type=int, default=1,
                        help="requests the engine runs at once, decoded round-robin (default 1)")
    parser.add_argument("--torch-threads", type=int, default=None, metavar="N",
                        help="threads of the model's forward (torch.set_num_threads; default: torch's, one per "
                             "core): fewer leave cores to the disk tier's threads")
    parser.add_argument("--device-size", default=None,
                        help="device pool, bytes or pages, e.g. 64MB, 200pages (default: derived)")
    parser.add_argument("--host-size", default=None, help="host pool, bytes or pages (default: derived)")
    parser.add_argument("--disk-size", type=argparse_type(positive_gb), default=None, metavar="GB|SIZE",
                        help="disk tier capacity: GB, or a size such as 500MB (default unbounded)")
    parser.add_argument("--url", default=None, help="benchmark the server at this URL instead (OpenAI chat API)")
    parser.add_argument("--api-key", default=None, help="with --url: bearer token of the server")
    parser.add_argument("--namespace", default=None,
                        help="with --url: the user field sent (default: a fresh one per invocation)")
    parser.add_argument("--seal-key", type=Path, default=None, metavar="PATH",
                        help="a key file (chunkstore keys new): the disk configurations run on a sealed store")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="put the disk tier under DIR (new or empty) and keep it (default: a temporary folder)")
    add_output_arguments(parser)  # --json (print the results as JSON), -o/--output PATH (also write them)
    parser.add_argument("--plot", metavar="PATH", type=Path, default=None,
                        help="also write a PNG comparing the configurations (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> MultiturnConfig:
    """Raises ValueError for a bad option."""
    workload = Workload(num_clients=args.num_clients, num_rounds=args.num_rounds,
                        request_length=args.request_length, output_length=args.output_length,
                        max_parallel=args.max_parallel, request_rate=args.request_rate, seed=args.seed)
    default = "server" if args.url else ",".join(s.value for s in IN_PROCESS)
    for option, path in (("--output", args.output), ("--plot", args.plot)):
        if path is not None and not path.parent.is_dir():
            raise ValueError(f"{option} {path}: folder {path.parent} does not exist")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (checked now, not after minutes of benchmark)
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install 'chunkstore[plot]'") from None
    return MultiturnConfig(
        workload=workload, preset=args.preset, model_path=args.model, dtype=args.dtype, page_size=args.page_size,
        max_running=args.max_running, torch_threads=args.torch_threads, device_size=args.device_size,
        host_size=args.host_size, disk_size_gb=args.disk_size, setups=Setup.parse_list(args.configs or default), url=args.url,
        api_key=args.api_key, namespace=args.namespace, keep=args.keep, show_progress=not args.no_progress,
        seal_key=args.seal_key)


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 done, 1 a request or the server failed (or a target was missed under --strict),
    2 bad options."""
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"chunkstore bench multiturn: error: {exc}", file=sys.stderr)
        return 2
    try:
        with exit_on_sigterm():
            result = run_multiturn_bench(cfg)
    except ValueError as exc:  # the loaded model cannot hold the workload, a size holds no page
        print(f"chunkstore bench multiturn: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"chunkstore bench multiturn: the benchmark failed: {exc}", file=sys.stderr)
        return 1
    emit_result(args, json_safe(result), format_table(result))
    if args.plot is not None:
        write_plot(result, args.plot)
    return 1 if args.strict and not result["all_pass"] else 0
