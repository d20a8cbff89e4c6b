"""Settings of ``baa serve``: batching, the latency target, limits on requests and the queue.

Built from a YAML file (``--config``) and ``--set key=value`` overrides like every other config;
unknown keys and bad values fail with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from budgeted_attention.config import check_bool, check_budgets, check_float, check_int, check_int_list, check_str
from budgeted_attention.errors import ConfigError
from budgeted_attention.serving.process import check_cpus

BACKENDS = ("torch", "onnxruntime")
POLICIES = ("slo", "fixed")
# The bounds of the numeric and boolean settings, checked by key in ServeConfig.__post_init__.
FLOAT_BOUNDS: dict[str, dict[str, float]] = {
    "default_budget": {"gt": 0.0, "le": 1.0}, "target_p95_ms": {"gt": 0.0}, "min_budget": {"gt": 0.0, "le": 1.0},
    "min_accuracy": {"ge": 0.0, "le": 1.0}, "max_wait_ms": {"ge": 0.0}, "arrival_window_ms": {"ge": 0.0},
    "arrival_memory_ms": {"ge": 0.0}, "header_timeout_s": {"gt": 0.0}, "body_timeout_s": {"gt": 0.0}, "keep_alive_s": {"gt": 0.0},
    "heartbeat_s": {"gt": 0.0}, "shutdown_timeout_s": {"ge": 0.0}, "watchdog_factor": {"ge": 1.0}, "watchdog_min_ms": {"gt": 0.0},
}
INT_MINIMUMS = {
    "max_batch_size": 1, "max_texts": 1, "max_text_chars": 1, "max_queue": 1, "threads": 1, "warmup_batches": 0,
    "calibration_seq_len": 0, "max_body_bytes": 0, "max_headers": 1, "max_header_bytes": 256, "max_connections": 1, "max_restarts": 1,
}
BOOLS = ("int8", "shed_expired", "deadline_batching", "engine_process", "freeze_gc", "auth_probes", "expose_paths")


@dataclass
class ServeConfig:
    """Server settings.

    Attributes:
        backend: ``torch`` (one sorted weight layout, any budget by prefix slicing) or
            ``onnxruntime`` (one exported graph per budget in ``budgets``; see ``baa export``).
        budgets: the operating points the SLO policy chooses among (and the graphs exported for
            the ONNX backend); a request's explicit budget is rounded down to one of them.
        int8: with ``backend: onnxruntime``, serve the int8 graphs of ``baa export --int8``
            (``budget-<b>.int8.onnx``) instead of the float ones.
        policy: what a request without ``budget`` or ``latency_ms`` gets: ``slo`` (the largest
            budget whose predicted completion meets ``target_p95_ms``) or ``fixed`` (``default_budget``).
        default_budget: the budget of the ``fixed`` policy.
        target_p95_ms: the latency target of the ``slo`` policy, milliseconds from arrival.
        min_budget: the SLO policy never goes below this budget.
        min_accuracy: if > 0, also never below the smallest budget whose validation accuracy
            (the run's results, never test) is at least this fraction.
        max_batch_size: texts per model call.
        max_wait_ms: how long the first request of a batch waits for others.
        arrival_window_ms: the SLO policy's arrival-rate window: a budget is refused when the
            requests expected to arrive while its batch runs (at the rate of the last window)
            could no longer be served on time even at the floor; 0 turns the check off.
        arrival_memory_ms: how long that check remembers the peak arrival rate (the highest rate
            of any arrival window within it) and forecasts the larger of it and the last window's
            rate: after a pause the last window is empty, and a burst's first batch would run at a
            budget its followers cannot recover from. 0: the last window only. Default 4000 ms
            (an interleaved A/B load test favoured it; see docs/serving.md).
        max_texts: texts per request.
        max_text_chars: characters per text (longer texts are refused, not truncated silently;
            the tokenizer still truncates to the model's max_len tokens).
        max_queue: texts waiting at most; more are shed with 503 and ``Retry-After``.
        shed_expired: drop a request whose deadline passed while it waited (503), so an
            overloaded server spends its time on requests that can still make it.
        deadline_batching: size policy batches to their deadlines: a batch of deadline requests is
            cut to the longest run of them (oldest first) that finishes by each one's deadline at
            the floor budget (deadlines that cannot be met even alone do not decide the cut), and
            (with ``shed_expired``) a request with a deadline of its own (``latency_ms``) that could
            not finish by it even alone at the floor is dropped at once instead of when it passes. A full
            batch at the floor can take about a deadline's length: the requests that waited for it
            then miss together, where a shorter batch answers most of them in time. On by default:
            with ``freeze_gc`` and a load generator that does not stall itself, an interleaved A/B
            load test held more requests to the deadline with it (docs/serving.md).
        threads: torch / onnxruntime intra-op threads per worker process.
        engine_process: run the model in a child process of its own (each worker gets one), fed
            through a pipe: the server's event loop (parsing, tokenising, answering) then never
            waits for the interpreter lock the model's Python code holds between operations, so a
            finished batch's answers go out while the next batch runs. Costs a pipe round trip per
            batch and a second interpreter at start-up. On by default: in interleaved A/B load
            tests (MiniLM, bursty arrivals) it held more requests to the deadline at 1.5x and 2x
            the dense capacity; false keeps the model in a thread of the server process.
        engine_cpus: CPU ids the engine process is pinned to; the server process then runs on
            the CPUs it had without them (Linux; needs ``engine_process``). Empty (the default):
            the operating system places both. With several workers every engine shares these CPUs.
        freeze_gc: once the model is loaded and calibrated, collect garbage and move every object
            alive then into Python's permanent generation (``gc.freeze()``), in the server process
            and in the engine process. A full collection otherwise walks the quarter-million
            objects the imported libraries leave behind (about 80 ms on this machine), and under
            load one runs every few seconds: every request in flight waits for it. On by default:
            interleaved A/B load tests held more requests to the deadline with it (docs/serving.md).
        warmup_batches: model calls per (budget, batch size) before timing at start-up.
        calibration_batch_sizes: batch sizes timed at start-up (others are interpolated).
        calibration_seq_len: tokens per text in the start-up timing (0: the run's median length).
        max_body_bytes: bytes per request body, refused with 413 from its Content-Length or as
            soon as a streamed body passes it, before any parsing. 0 (the default): derived from
            ``max_texts`` and ``max_text_chars`` (:meth:`body_limit`), the largest valid request.
        max_headers: header lines per request; more get 431.
        max_header_bytes: bytes of the request line and headers together; more get 431 as soon
            as they arrive (before the head is parsed whole).
        header_timeout_s: a connection must deliver a whole request head within this many
            seconds of opening (or of its previous answer), else it is answered 408 and closed.
        body_timeout_s: a request body must arrive whole within this many seconds of the end of
            its head (408 past it), however slowly or steadily it is sent.
        max_connections: connections each worker process holds open at most (uvicorn's
            ``limit_concurrency``); a connection past it is answered 503 and closed at once, so
            clients that hold connections open cannot exhaust the server's file descriptors.
        keep_alive_s: an idle keep-alive connection is closed after this many seconds.
        shutdown_timeout_s: on SIGTERM, how long requests in flight may take to finish; those
            still running then are answered 503.
        watchdog_factor: a batch taking longer than this many times its calibrated prediction
            means a hung engine process: it is killed and restarted (``engine_process`` only).
        watchdog_min_ms: the shortest such deadline, and the heartbeat's deadline.
        heartbeat_s: an idle engine process is pinged this often (a dead or stopped one is replaced).
        max_restarts: failed restarts in a row after which the server gives up (``/healthz`` 503).
        allowed_hosts: if not empty, the Host header names a request may carry (``*.example.com``
            matches subdomains); others get 400. Health and metrics probes are exempt.
        auth_probes: with an API key, also require it on ``/healthz``, ``/readyz`` and ``/metrics``
            (open by default, for orchestrators and scrapers).
        expose_paths: show absolute paths and process ids in ``/v1/info`` and error bodies
            (off: run and checkpoint names only).
    """

    backend: str = "torch"
    int8: bool = False
    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    policy: str = "slo"
    default_budget: float = 1.0
    target_p95_ms: float = 100.0
    min_budget: float = 0.25
    min_accuracy: float = 0.0
    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    arrival_window_ms: float = 250.0
    arrival_memory_ms: float = 4000.0
    max_texts: int = 64
    max_text_chars: int = 2000
    max_queue: int = 256
    shed_expired: bool = True
    deadline_batching: bool = True
    threads: int = 1
    engine_process: bool = True
    engine_cpus: list[int] = field(default_factory=list)
    freeze_gc: bool = True
    warmup_batches: int = 1
    calibration_batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    calibration_seq_len: int = 0
    max_body_bytes: int = 0
    max_headers: int = 100
    max_header_bytes: int = 16384
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_connections: int = 256
    keep_alive_s: float = 5.0
    shutdown_timeout_s: float = 10.0
    watchdog_factor: float = 10.0
    watchdog_min_ms: float = 2000.0
    heartbeat_s: float = 1.0
    max_restarts: int = 3
    allowed_hosts: list[str] = field(default_factory=list)
    auth_probes: bool = False
    expose_paths: bool = False

    def __post_init__(self) -> None:
        """Check every value, naming ``serve.<key>``."""
        for key, choices in (("backend", BACKENDS), ("policy", POLICIES)):
            if getattr(self, key) not in choices:
                raise ConfigError(f"serve.{key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
        self.budgets = sorted(check_budgets(self.budgets, "serve.budgets"))
        for key, bounds in FLOAT_BOUNDS.items():
            setattr(self, key, check_float(getattr(self, key), f"serve.{key}", **bounds))
        for key, least in INT_MINIMUMS.items():
            check_int(getattr(self, key), f"serve.{key}", ge=least)
        for key in BOOLS:
            check_bool(getattr(self, key), f"serve.{key}")
        if self.int8 and self.backend != "onnxruntime":
            raise ConfigError(f"serve.int8 serves the int8 ONNX graphs of 'baa export --int8': it needs backend onnxruntime, got {self.backend!r}")
        if self.min_budget > self.budgets[-1]:
            raise ConfigError(f"serve.min_budget ({self.min_budget}) is above every budget in serve.budgets {self.budgets}")
        if self.max_queue < self.max_texts:
            raise ConfigError(f"serve.max_queue ({self.max_queue}) must hold one full request (serve.max_texts = {self.max_texts})")
        self.engine_cpus = check_cpus(check_int_list(self.engine_cpus, "serve.engine_cpus", ge=0, allow_empty=True), "serve.engine_cpus")
        if self.engine_cpus and not self.engine_process:
            raise ConfigError(f"serve.engine_cpus ({self.engine_cpus}) pins the engine process: it needs serve.engine_process: true")
        sizes = check_int_list(self.calibration_batch_sizes, "serve.calibration_batch_sizes", ge=1)
        self.calibration_batch_sizes = sorted({min(s, self.max_batch_size) for s in sizes} | {1, self.max_batch_size})
        if not isinstance(self.allowed_hosts, list):
            raise ConfigError(f"serve.allowed_hosts must be a list of host names, got {self.allowed_hosts!r}")
        self.allowed_hosts = [check_str(h, "serve.allowed_hosts", allow_empty=False).lower() for h in self.allowed_hosts]

    def body_limit(self) -> int:
        """Bytes a request body may have: ``max_body_bytes``, or when 0 the largest valid request,
        ``max_texts`` texts of ``max_text_chars`` characters each written as JSON escapes (12
        bytes per character: a surrogate pair ``\\uXXXX\\uXXXX``), plus 4 KiB for the rest."""
        if self.max_body_bytes:
            return self.max_body_bytes
        return self.max_texts * (12 * self.max_text_chars + 8) + 4096


def snap_to(budget: float, budgets: list[float]) -> float:
    """The largest of the ascending ``budgets`` not above ``budget`` (the smallest if all are above):
    the budget a server with these operating points runs a request for ``budget`` at."""
    below = [b for b in budgets if b <= budget + 1e-9]
    return below[-1] if below else budgets[0]
