"""The run directory: the one owner of its file names, its layout and its checks.

A run directory is the artifact format of the library: ``baa experiment`` / ``baa lm`` /
``baa demo`` write it; ``baa report``, ``serve``, ``bench``, ``export`` and ``merge`` read it.
Every path into one goes through :class:`RunDir`::

    RUN/
      config.yaml, config.sha256      resolved config and its digest (resume and merge check it)
      run_info.json                   seeds, environment, every invocation with its commit
      tokenizer.json, labels.json     text -> the model's ids; the class names of its logits
      lengths.json                    token counts of the training split (bench --lengths, serve)
      results.{json,csv,md}, summary.json, routed.{json,md}, *.png
      bench.{json,md}, bench-<method>.{json,md}, routing_bench.{json,md}
      serve_load.json, serve_soak.json (benchmarks/serve_*.py write them into their own --out)
      units/seed<N>/<unit>.json       finished-unit records (what a resumed run skips)
      checkpoints/seed<N>/<name>.{safetensors,json}
      onnx/                           baa export's default output
      .lock                           held while a process writes (:mod:`budgeted_attention.runlock`)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, overload

from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.io import environment_info, write_json_atomic, write_yaml_atomic
from budgeted_attention.runlock import LOCK_NAME

HARD = "budgeted-hard"  # the checkpoint serve, bench and export use by default

_SEED_DIR = re.compile(r"^seed(?P<seed>-?\d+)$")


class RunDirError(ConfigError):
    """A folder is not the run directory a command needs (the message names it and what is missing)."""


class Artifact:
    """One file or folder of a run directory, declared on :class:`RunDir`: ``RunDir.config.name``
    is its name (``"config.yaml"``), ``run.config`` its path in the run directory ``run``."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc

    @overload
    def __get__(self, run: None, owner: type) -> Artifact: ...

    @overload
    def __get__(self, run: RunDir, owner: type) -> Path: ...

    def __get__(self, run: RunDir | None, owner: type) -> Artifact | Path:
        return self if run is None else run.path / self.name


def resume_script(out: str | Path, script: str, args: list[str], force: bool = False, sources: tuple[str | Path, ...] = ()) -> int | None:
    """What a benchmark script does first with its ``--out`` (:meth:`RunDir.measured_by`, with the
    run directories it measures as ``sources``): None to measure; 0 (a line says so) when the
    directory holds this measurement already, unless ``force``; 2 (a line on stderr names why)
    when it holds another or a stale one."""
    try:
        if not force and RunDir(out).measured_by(script, args, sources):
            print(f"{out}: measured already by this command (--force measures anew)")
            return 0
    except RunDirError as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        return 2
    return None


class RunDir:
    """A run directory at ``path``: the path of each artifact, the lookups over seeds and
    checkpoints, :meth:`create` (the pipeline's stamp) and :meth:`open` (the readers' check).

    Constructing one checks nothing: writers build paths into a folder that may not exist yet.
    """

    config = Artifact("config.yaml", "The resolved configuration.")
    config_digest = Artifact("config.sha256", "The digest of the configuration the units were computed under.")
    run_info = Artifact("run_info.json", "Seeds, environment and every invocation (command, start, commit).")
    tokenizer = Artifact("tokenizer.json", "The run's tokenizer (text -> the ids of the model's embedding rows).")
    labels = Artifact("labels.json", '``{"class_names": [...]}``: the classes of the model\'s logits.')
    lengths = Artifact("lengths.json", '``{"split": "train", "lengths": [...]}``: token counts of the training split.')
    summary = Artifact("summary.json", "The headline figures.")
    results_json = Artifact("results.json", '``{"rows": [...]}`` (and ``partial`` for an unfinished run).')
    results_csv = Artifact("results.csv", "The result rows as CSV.")
    results_md = Artifact("results.md", "The result rows as a Markdown document.")
    bench_json = Artifact("bench.json", "The budgeted-hard model's benchmark (``baa bench``'s default output).")
    bench_md = Artifact("bench.md", "The benchmark as Markdown.")
    routing_bench_json = Artifact("routing_bench.json", "``baa bench-routing``'s result.")
    routing_bench_md = Artifact("routing_bench.md", "``baa bench-routing``'s result as Markdown.")
    routed_json = Artifact("routed.json", "Per-input routing speed, calibration and heads by difficulty.")
    routed_md = Artifact("routed.md", "The per-input routing results as Markdown.")
    serve_load = Artifact("serve_load.json", "A load test of ``baa serve`` (benchmarks/serve_load.py).")
    decode_bench = Artifact("decode_bench.json", "A decoder's generation benchmark: prefill, decode, K/V cache (benchmarks/gemma_decode.py).")
    serve_soak = Artifact("serve_soak.json", "A fault and hostile-client test of ``baa serve`` (benchmarks/serve_soak.py).")
    units_dir = Artifact("units", "The finished-unit records of every seed.")
    checkpoints_dir = Artifact("checkpoints", "The checkpoints of every seed.")
    onnx_dir = Artifact("onnx", "Where ``baa export`` writes its graphs by default (and serve looks for them).")
    lock = Artifact(LOCK_NAME, "The writer's advisory lock (:mod:`budgeted_attention.runlock`).")
    # Written once per run from the data: identical in runs of one config (merge copies them once).
    DATA_FILES = (tokenizer.name, labels.name, lengths.name)
    # What a run measured, without weights, graphs, tokenizer or data: what a study archive keeps
    # (see :meth:`record_files`), a few hundred kB where the checkpoints are hundreds of MB.
    RECORDS = (
        config.name, config_digest.name, run_info.name, labels.name, summary.name, results_json.name,
        routing_bench_json.name, routed_json.name, serve_load.name, serve_soak.name, decode_bench.name,
    )

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir('{self.path}')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def benches(self) -> list[Path]:
        """Every ``bench*.json`` (``bench.json`` and ``bench-<method>.json``), sorted."""
        return sorted(self.path.glob("bench*.json"))

    def figures(self) -> list[Path]:
        """Every figure (``*.png``) at the top of the run directory, sorted."""
        return sorted(self.path.glob("*.png"))

    def record_files(self) -> list[Path]:
        """The files that record what the run measured and how (:attr:`RECORDS`, every
        ``bench*.json``, figure and finished-unit record), those that exist, sorted."""
        named = [self.path / name for name in self.RECORDS]
        return sorted(p for p in [*named, *self.benches(), *self.figures(), *self.unit_records()] if p.is_file())

    def measured_by(self, script: str, args: list[str], sources: tuple[str | Path, ...] = ()) -> bool:
        """Whether a benchmark script (``benchmarks/*.py``) already measured into this run
        directory with these command-line ``args``: ``results.json`` exists, and ``run_info.json``
        (the scripts write it last) records the same script and arguments and is newer than the
        ``results.json`` of every run directory in ``sources`` (the runs it measured: retrained
        since, they make the measurement stale). What makes ``make study-NAME`` resumable across
        its script steps.

        Raises :class:`RunDirError` when the directory holds another measurement (other script or
        arguments), a stale one, or results without a readable ``run_info.json`` to say how they
        were made (``--force`` measures anew).
        """
        if not self.results_json.is_file():
            return False
        again = f"{script} --force measures anew, or give another --out"
        recorded: Any = None
        try:
            info = json.loads(self.run_info.read_text(encoding="utf-8"))
            invocations = info.get("invocations") or [{}]
            recorded = info.get("command") or (invocations[0].get("command") if isinstance(invocations[0], dict) else None)
        except (OSError, ValueError, AttributeError):
            pass  # missing, not JSON, or not an object: no recorded command
        if not isinstance(recorded, list) or len(recorded) < 2:
            raise RunDirError(f"'{self.path}' holds {self.results_json.name} but no recorded command in {self.run_info.name}: {again}")
        if Path(str(recorded[1])).name != Path(script).name:  # recorded: python SCRIPT ARGS...
            raise RunDirError(f"'{self.path}' holds a measurement of {recorded[1]}, not {script}: {again}")
        if [str(a) for a in recorded[2:] if a != "--force"] != [a for a in args if a != "--force"]:
            raise RunDirError(f"'{self.path}' holds a measurement of other arguments ({' '.join(map(str, recorded[2:]))}): {again}")
        measured = self.run_info.stat().st_mtime
        for source in sources:
            results = RunDir(source).results_json
            if results.is_file() and results.stat().st_mtime > measured:
                raise RunDirError(f"'{self.path}' was measured before '{source}' changed (its {results.name} is newer): {again}")
        return True

    def archive(self, target: str | Path) -> RunDir:
        """Copy :meth:`record_files` to the folder ``target`` (same relative paths) and return it
        as a run directory: the report reads it as it reads this one, on any machine.

        The copy is made beside ``target`` and swapped in by two renames, so ``target`` never holds
        a mix of two archives; a crash between the renames leaves the old archive beside it as
        ``.NAME.old-PID`` (restored by the next call). Refused (:class:`RunDirError`) when
        ``target`` is this run directory, lies inside it or holds it: the swap would delete it."""
        target = Path(target)
        source, resolved = self.path.resolve(), target.resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            raise RunDirError(f"cannot archive '{self.path}' to '{target}': one folder holds the other")
        for stale in target.parent.glob(f".{target.name}.tmp-*") if target.parent.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        for old in target.parent.glob(f".{target.name}.old-*") if target.parent.is_dir() else []:
            if target.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.rename(target)  # an earlier swap stopped between its renames
        staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        for path in self.record_files():
            destination = staging / path.relative_to(self.path)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)
        staging.mkdir(parents=True, exist_ok=True)
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return RunDir(target)

    # ------------------------------------------------------------------ per seed

    def unit_dir(self, seed: int) -> Path:
        """``units/seed<seed>/``."""
        return self.units_dir / f"seed{seed}"

    def checkpoint_dir(self, seed: int) -> Path:
        """``checkpoints/seed<seed>/``."""
        return self.checkpoints_dir / f"seed{seed}"

    def seed_dirs(self, seed: int) -> tuple[Path, Path]:
        """(``units/seed<seed>``, ``checkpoints/seed<seed>``): everything one seed computed."""
        return self.unit_dir(seed), self.checkpoint_dir(seed)

    def unit(self, seed: int, name: str) -> Path:
        """``units/seed<seed>/<name>.json``: the record of a finished unit."""
        return self.unit_dir(seed) / f"{name}.json"

    def unit_records(self) -> list[Path]:
        """Every finished-unit record (``units/*/*.json``), sorted."""
        return sorted(self.units_dir.glob("*/*.json"))

    def checkpoint(self, seed: int, name: str) -> Path:
        """``checkpoints/seed<seed>/<name>``: a checkpoint's base path (``.safetensors`` and ``.json`` beside)."""
        return self.checkpoint_dir(seed) / name

    def checkpoint_description(self, seed: int, name: str) -> Path:
        """``checkpoints/seed<seed>/<name>.json``: a checkpoint's description."""
        return self.checkpoint_dir(seed) / f"{name}.json"

    def seeds(self) -> list[int]:
        """The seeds with a ``units/seed<N>`` or ``checkpoints/seed<N>`` folder, sorted."""
        found = set()
        for folder in (self.units_dir, self.checkpoints_dir):
            if folder.is_dir():
                found |= {int(m["seed"]) for entry in folder.iterdir() if entry.is_dir() and (m := _SEED_DIR.match(entry.name))}
        return sorted(found)

    def find_checkpoint(self, seed: int | None = None, name: str = HARD, command: str = "baa demo") -> Path:
        """The description of checkpoint ``name`` of the first seed that has one (or of ``seed``).

        Raises:
            CheckpointError: there is none; the message suggests ``command --out RUN``.
        """
        candidates = sorted(self.checkpoints_dir.glob(f"seed*/{name}.json"))
        if seed is not None:
            candidates = [c for c in candidates if c.parent.name == f"seed{seed}"]
        if not candidates:
            which = f" for seed {seed}" if seed is not None else ""
            raise CheckpointError(
                f"no {name} checkpoint{which} in '{self.checkpoints_dir}' (run '{command} --out {self.path}' first)"
            )
        return candidates[0]

    # ------------------------------------------------------------------ making and opening

    @classmethod
    def create(cls, path: str | Path, resolved_config: dict[str, Any], seeds: list[int]) -> RunDir:
        """Create the folder and record ``config.yaml`` and ``run_info.json`` (seeds, versions, commands).

        A resumed run keeps its earlier invocations and appends the new one (command, start time,
        commit and dirty flag) to ``invocations``; ``environment`` is the latest invocation's.
        """
        run = cls(path)
        run.path.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(run.config, resolved_config)
        environment = environment_info()
        # Each invocation's own commit: a resumed run's units may come from different code.
        invocation = {
            "command": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "commit": environment.get("commit"), "dirty": environment.get("dirty"),
        }
        previous: list[dict[str, Any]] = []
        if run.run_info.exists():
            try:
                previous = json.loads(run.run_info.read_text()).get("invocations", [])
            except (json.JSONDecodeError, AttributeError):
                previous = []
        write_json_atomic(
            run.run_info,
            {"seeds": seeds, "environment": environment, "invocations": [*previous, invocation]},
        )
        return run

    @classmethod
    def open(cls, path: str | Path, *, require: tuple[Artifact, ...] = (config,), hint: str = "") -> RunDir:
        """The run directory at ``path``, checked to exist and to hold the files ``require``.

        Raises:
            RunDirError: one line naming the path and what is missing (``hint``, e.g. what to
                run first, is appended in parentheses).
        """
        run = cls(path)
        if not run.path.exists():
            raise RunDirError(f"run directory not found: '{run.path}'")
        if not run.path.is_dir():
            raise RunDirError(f"not a run directory: '{run.path}' is a file")
        return run.check(*require, hint=hint)

    def check(self, *files: Artifact, hint: str = "") -> RunDir:
        """This run directory, checked to hold ``files`` (e.g. ``RunDir.config_digest``).

        Raises:
            RunDirError: one line naming the path and the missing files (and ``hint``).
        """
        missing = [file.name for file in files if not (self.path / file.name).is_file()]
        if missing:
            raise RunDirError(f"'{self.path}' is not a run directory: no {' or '.join(missing)}" + (f" ({hint})" if hint else ""))
        return self

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir:
        """The run a checkpoint at ``RUN/checkpoints/seed<N>/NAME`` belongs to, else the checkpoint's own folder."""
        folder = Path(checkpoint).parent
        if folder.parent.name == cls.checkpoints_dir.name:
            return cls(folder.parent.parent)
        return cls(folder)

    @classmethod
    def locate(cls, target: str | Path, seed: int | None = None, name: str = HARD, command: str = "baa demo") -> tuple[RunDir, Path]:
        """(folder, checkpoint description) of what a command was pointed at: a run directory
        (its :meth:`find_checkpoint`) or a checkpoint's ``.json`` (then the folder is the
        checkpoint's own, where its tokenizer and outputs are looked for)."""
        path = Path(target)
        if path.suffix == ".json" and path.is_file():
            return cls(path.parent), path
        run = cls.open(path, require=())
        return run, run.find_checkpoint(seed, name, command)
