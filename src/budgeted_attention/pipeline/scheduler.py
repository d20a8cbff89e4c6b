"""The one pipeline: method x budget x seed on one data set, resumable. ``baa experiment``,
``baa lm`` and ``baa demo`` (an embedded experiment config) all run it.

The work is cut into units (:mod:`budgeted_attention.pipeline.units`), planned by the methods
(:mod:`budgeted_attention.pipeline.methods`); this module knows none of them. Each finished unit
leaves ``units/seed<N>/<unit>.json`` (written atomically, after the unit's checkpoint); a rerun
skips finished units, reloads the checkpoints it needs, and ends with the same rows (every unit
seeds its own RNGs). A run directory made with another config is refused (``config.sha256``, and
the digest each unit record carries).

Choices never see the test split: it is sealed (:class:`budgeted_attention.data.dataset.SealedSplit`)
and read only in the final evaluation of each finished model.

Under ``torchrun`` every rank runs every training unit (rank 0 decides which are finished and
alone writes); timing units run on rank 0 alone.
"""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from budgeted_attention.config import to_dict
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import remove_stale_temp_files, write_json_atomic, write_text_atomic
from budgeted_attention.pipeline.config import ExperimentConfig, config_digest, load_experiment_config, unit_config_digest
from budgeted_attention.pipeline.context import RunContext, make_splits
from budgeted_attention.pipeline.methods import plan
from budgeted_attention.pipeline.outputs import Collected, write_outputs
from budgeted_attention.pipeline.units import UNIT_DIGEST_KEY, Unit
from budgeted_attention.pipeline.builders import make_builder
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.rundir import RunDir
from budgeted_attention.runlock import RunDirLock
from budgeted_attention.training import distributed
from budgeted_attention.training.stages import seed_everything


def seed_indices(units: list[Unit]) -> list[int]:
    """Per unit, the index its random seed is derived from (``1000 * seed + index``): its position
    in the plan, not counting the units that are not :attr:`~Unit.seeded`."""
    indices, position = [], 0
    for unit in units:
        indices.append(position)
        position += unit.seeded
    return indices


class Experiment:
    """Runs the units of an :class:`ExperimentConfig` into a run directory, skipping finished ones."""

    def __init__(self, cfg: ExperimentConfig, out_dir: str | Path, progress: bool = True, log=print) -> None:
        self.cfg, self.run_dir, self.progress, self.log = cfg, RunDir(out_dir), progress, log
        self.out = self.run_dir.path
        self.partial: str | None = None
        # One writer per run directory, taken before anything is read: a second writer (another
        # config included) is told at once who holds it. Released at the end of :meth:`run`, on a
        # failed start, or when an object that never ran is collected.
        self._lock = RunDirLock(self.out, log=log).acquire()
        weakref.finalize(self, self._lock.release)
        try:
            self.context = self._start()
        except BaseException:
            self._lock.release()
            raise

    def _start(self) -> RunContext:
        cfg, run = self.cfg, self.run_dir
        if run.config_digest.is_file() and run.config_digest.read_text().strip() != config_digest(cfg):
            raise ConfigError(f"'{self.out}' holds a run with a different configuration; use another --out")
        if self._lock.held:  # every other writer of this directory is shut out: what is left over is stale
            remove_stale_temp_files(self.out, self.log)
        # Everything that can fail on a config or data mistake runs before the run directory is
        # stamped, so a failed start can be rerun into the same --out after the fix.
        builder = make_builder(cfg.model_family, cfg.model, cfg.pretrained, cfg.group_size)
        self.out.mkdir(parents=True, exist_ok=True)
        splits = make_splits(cfg, run, builder.pretrained_tokenizer())
        builder.prepare(splits, cfg.bench.seq_lens)
        write_text_atomic(run.config_digest, config_digest(cfg) + "\n")
        RunDir.create(self.out, to_dict(cfg), cfg.seeds)
        write_json_atomic(run.lengths, {"split": "train", "lengths": splits.train.lengths()})
        splits.to(distributed.current().device)  # data moved once; training and evaluation batches start there
        if splits.class_names:  # what baa serve answers with
            write_json_atomic(run.labels, {"class_names": list(splits.class_names)})
        distributed.barrier()  # every rank starts the units after rank 0 stamped the run directory
        return RunContext(cfg, run, splits, builder, self.progress, self.log, unit_config_digest(cfg))

    def plan(self) -> list[Unit]:
        """The run's units in execution order."""
        return plan(self.cfg)

    def run_unit(self, unit: Unit, index: int, redo: bool = False) -> dict[str, Any]:
        """Do ``unit`` unless it is finished (``redo``: do it anyway, its record replaced
        atomically when it finishes), with its RNGs seeded from its seed and ``index``; returns
        its record (``rows`` and extras)."""
        ctx = self.context
        path = ctx.unit_path(unit.id)
        if distributed.agree(path.exists() and not redo):  # rank 0 decides, so every rank runs the same units
            return ctx.read_unit(unit.id)
        runtime = distributed.current()
        if runtime.distributed and unit.timing and not runtime.is_main:
            # Timing-only units run on rank 0 alone (timing beside another rank's copy would be
            # contended); the other ranks wait in the barrier rank 0 enters after writing the
            # record, then read it. No second `agree` here: every rank makes exactly one per unit,
            # or rank 0's decision for the next unit would pair with this one.
            distributed.barrier()
            return ctx.read_unit(unit.id)
        seed_everything(1000 * unit.id.seed + index)
        started = time.time()
        record = unit.work(ctx, unit.id)
        record["rows"] = [r.to_dict() if isinstance(r, ResultRow) else r for r in record.get("rows", [])]
        record["seconds"] = time.time() - started
        record[UNIT_DIGEST_KEY] = ctx.unit_digest
        write_json_atomic(path, record)  # rank 0 only (other ranks' writes are discarded)
        distributed.barrier()  # the next unit reads what rank 0 wrote (checkpoints, rankings)
        return record

    def _timing_to_redo(self, units: list[Unit]) -> set[Unit]:
        """The plan's timing units, to be run again over their records; refuses a run whose
        training units are not all finished (a retime trains nothing)."""
        missing = [str(u.id) for u in units if not u.timing and not self.context.unit_path(u.id).exists()]
        if distributed.agree(bool(missing)):
            raise ConfigError(
                f"--retime times a finished run, and '{self.out}' misses {len(missing)} training unit(s) "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): run it without --retime first"
            )
        return {u for u in units if u.timing}

    def run(self, finished_only: bool = False, retime: bool = False) -> dict[str, Any]:
        """Run every unfinished unit, then write the outputs. ``finished_only``: run nothing and
        write the outputs of the units already finished (a partial run, said so in the notes).
        ``retime``: run every timing unit again (its record replaced when it finishes, so an
        interrupted retime keeps the timings it has not redone); the run must be finished, and
        nothing is trained. For timings taken on a busy machine, e.g. seeds trained side by side.
        The run directory's lock is held throughout (taken again when this object ran before) and
        released at the end, whatever happens."""
        with self._lock:
            return self._run(finished_only, retime)

    def _run(self, finished_only: bool, retime: bool) -> dict[str, Any]:
        if finished_only and retime:
            raise ConfigError("--retime times the models again and --finished-only runs nothing: use one of them")
        started, ctx = time.time(), self.context
        units = self.plan()
        indices = dict(zip(units, seed_indices(units), strict=True))  # of the whole plan, whatever is left out below
        redo = self._timing_to_redo(units) if retime else set()
        if redo:
            self.log(f"retiming: {len(redo)} timing unit(s) run again in {self.out}; trained models are kept")
        done = sum(ctx.unit_path(u.id).exists() for u in units)
        if done:
            self.log(f"resuming: {done} of {len(units)} units already finished in {self.out}")
        self.partial = None
        if finished_only:
            finished = [distributed.agree(ctx.unit_path(u.id).exists()) for u in units]  # rank 0 decides
            missing = [str(u.id) for u, ok in zip(units, finished, strict=True) if not ok]
            units = [u for u, ok in zip(units, finished, strict=True) if ok]
            if missing:
                self.partial = f"PARTIAL RUN: {len(units)} of {len(units) + len(missing)} units finished; missing: {', '.join(missing)}."
        collected = Collected()
        bar = tqdm(units, desc=self.cfg.name, disable=not self.progress)
        for unit in bar:
            bar.set_postfix(unit=str(unit.id))
            record = self.run_unit(unit, indices[unit], redo=unit in redo)
            unit.collect(ctx, collected, unit.id, record)
        return write_outputs(ctx, collected, time.time() - started, self.partial)


def run_experiment(
    config_path: str, out_dir: str | None, overrides: list[str] | None = None, progress: bool = True, finished_only: bool = False,
    task: str | None = None, retime: bool = False, quick: bool = False,
) -> dict[str, Any]:
    """``baa experiment`` / ``baa lm``: load the config (its quick variant with ``quick``) and run
    it into ``out_dir`` (default ``runs/<name>``)."""
    if finished_only and retime:  # before anything is read or written
        raise ConfigError("--retime times the models again and --finished-only runs nothing: use one of them")
    cfg = load_experiment_config(config_path, overrides, task, quick=quick)
    return run_config(cfg, out_dir or f"runs/{cfg.name}", progress, finished_only=finished_only, retime=retime)


def run_config(cfg: ExperimentConfig, out_dir: str | Path, progress: bool = True, log=print, **options: bool) -> dict[str, Any]:
    """Run ``cfg`` into ``out_dir`` on the config's device (under ``torchrun``, one process per
    rank, rank 0 alone reporting); ``options`` go to :meth:`Experiment.run`."""
    with distributed.running(cfg.train.device, cfg.train.bf16) as runtime:
        quiet = not runtime.is_main  # one process reports (rank 0)
        return Experiment(cfg, out_dir, progress=progress and not quiet, log=(lambda *_: None) if quiet else log).run(**options)
