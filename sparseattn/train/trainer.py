"""The training loop: `Trainer` (the commands that drive it are in cli.py).

RUN_DIR holds config.json, best.pt (weights of the best validation epoch, used for the final test
numbers and plots when keep_best is on; with ema_decay > 0 every evaluation, best.pt included, uses
the moving average of the weights), checkpoint.pt (written atomically at each epoch end, every
checkpoint_every steps, at max_steps, when the time budget runs out and on Ctrl-C), metrics.jsonl
(one JSON object per line: kind "train" every log_every steps, "valid" each epoch, "test" at the
end), results.json and plots/; each of them names the run it belongs to (its run id), so a folder
mixing two runs' files is refused (run_folder.py). An --overwrite run trains beside the old run
until its first epoch ends (`take_place`); an interrupt before that discards it.

The loop is generic: it asks the task (tasks/base.py) for batches and for a batch's loss and
stats, so any registered task/model pair (model_configs.py) gets the progress bar, metrics
log, checkpoints and exact resume. A checkpoint stores the data position (epoch, batch, step);
each epoch's batch order is a function of (seed, epoch), and the RNG states are those after the
last completed step, so a resumed run takes the same steps as an uninterrupted one. A run stopped
by `time_budget_min` validates the cut-short epoch and counts it as done; resuming it with a larger
budget starts the next epoch.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Tuple

import torch

from . import checkpoint as ckpt_io
from .config import Config
from .ema import WeightEMA
from .interrupts import deferred_interrupt
from .metrics import Meter, read_metrics
from .model_configs import lr_dim
from .run_folder import RUN_ID, new_run_id, swap_in
from .tasks import get_task


class NoamLambda:
    """lr multiplier factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""

    def __init__(self, d_model: int, factor: float, warmup: int) -> None:
        self.d_model, self.factor, self.warmup = d_model, factor, max(warmup, 1)

    def __call__(self, step: int) -> float:
        step += 1
        return self.factor * self.d_model**-0.5 * min(step**-0.5, step * self.warmup**-1.5)


def resolve_device(name: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu; a cuda device without CUDA is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device={name!r} is not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device={name}: CUDA is not available here (torch {torch.__version__}); use --device=cpu")
    return device


def fused_adam_supported(params) -> bool:
    """Whether torch's fused Adam takes these parameters (floating point, on CPU or CUDA): one kernel
    updates every parameter, where the default on CPU runs a dozen ops per parameter tensor (the
    step of the sort task's 45 tensors: 0.65 ms against 3.1, 1 thread)."""
    params = list(params)
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


class NonFiniteLoss(ValueError):
    """Training produced a NaN or infinite loss; nothing was saved after the last good step."""


class Trainer:
    main_process = True  # writes checkpoints, logs and progress (False on ranks > 0 under torchrun)

    def __init__(self, cfg: Config, resume: bool = False, staging: Optional[Path] = None) -> None:
        """staging: the folder an --overwrite run sets up and trains in until its first epoch ends
        (or the run does), which replaces the run in run.out with it (run_folder.py); run.out is
        untouched until then."""
        run = cfg.run
        self.cfg, self.staging = cfg, staging
        self.run_id = new_run_id()  # a resumed run keeps its checkpoint's
        self.stop = {"stop": False}  # set by an interrupt while fit() runs (deferred_interrupt)
        self._write_in(Path(run.out) if staging is None else staging)
        if run.threads:
            torch.set_num_threads(run.threads)
        self.device = resolve_device(run.device)
        self.task = get_task(cfg.task)
        # the task's own files (multi30k's tokenizer.json) go where the run writes
        self.task.setup(cfg if staging is None else replace(cfg, run=replace(run, out=str(staging))))
        torch.manual_seed(run.seed)
        self.model = cfg.model_cfg.build(self.task.model_info())
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=1.0,
            betas=(run.beta1, run.beta2),
            eps=run.adam_eps,
            fused=fused_adam_supported(self.model.parameters()),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, NoamLambda(lr_dim(cfg), run.lr_factor, run.warmup)
        )
        self.position = {"epoch": 0, "batch": 0, "step": 0}
        self.history: list = []  # one record per finished epoch
        self.train_seconds = 0.0  # wall time spent in fit(), summed over resumed runs
        self._fit_start: Optional[float] = None
        self.rng = ckpt_io.rng_state()
        self.ema = WeightEMA(self.model, run.ema_decay) if run.ema_decay > 0 else None
        if resume:
            self._load(ckpt_io.load(self.ckpt_path, self.device))
        if self.main_process:
            ckpt_io.remove_stale_temps(self.ckpt_path)
            ckpt_io.remove_stale_temps(self.best_path)
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps({**cfg.to_dict(), RUN_ID: self.run_id}, indent=2) + "\n")
            self._trim_metrics()

    # ---- checkpoints ------------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "version": 2,
            "config": self.cfg.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng,
            "position": dict(self.position),
            "task_state": self.task.state_dict(),
            "history": self.history,
            "train_seconds": self.elapsed(),
            RUN_ID: self.run_id,
            **({"ema": self.ema.checkpoint_state()} if self.ema is not None else {}),
        }

    def elapsed(self) -> float:
        running = time.perf_counter() - self._fit_start if self._fit_start is not None else 0.0
        return self.train_seconds + running

    def save(self, started: bool = False) -> None:
        """Write checkpoint.pt. started: the checkpoint ends an epoch or the run, at which an
        --overwrite run takes the old run's place (`take_place`)."""
        if self.main_process:
            ckpt_io.save_atomic(self.state(), self.ckpt_path)
            if started:
                self.take_place()

    def _write_in(self, folder: Path) -> None:
        self.out = folder
        self.ckpt_path = folder / "checkpoint.pt"
        self.best_path = folder / "best.pt"  # weights of the best validation epoch (keep_best)

    def take_place(self) -> None:
        """An --overwrite run whose first epoch (or whole run) has ended replaces the old run in
        run.out and writes there from now on (main process only); not once an interrupt has come,
        which discards it instead: an interrupt never replaces a run."""
        if self.staging is not None and self.main_process and not self.stop["stop"]:
            swap_in(self.staging, Path(self.cfg.run.out))
            self.staging = None
            self._write_in(Path(self.cfg.run.out))

    def _load(self, state: dict) -> None:
        missing = [k for k in ("optimizer", "scheduler", "rng", "position", "history") if k not in state]
        if missing:
            raise ValueError(
                f"{self.ckpt_path} cannot be resumed: it lacks {', '.join(missing)} (best.pt only holds "
                "weights; resume from checkpoint.pt)"
            )
        if ckpt_io.non_finite([state["model"], state["optimizer"]]):
            raise ValueError(
                f"{self.ckpt_path} holds NaN or infinite weights or optimizer state; refusing to resume into them"
            )
        position = state["position"]
        if not (
            isinstance(position, dict)
            and all(isinstance(position.get(k), int) and position[k] >= 0 for k in ("epoch", "batch", "step"))
        ):
            raise ValueError(
                f"{self.ckpt_path} cannot be resumed: its position entry must hold non-negative ints epoch, "
                f"batch and step, got {position!r:.100}"
            )
        if not isinstance(state["history"], list):
            raise ValueError(f"{self.ckpt_path} cannot be resumed: its history entry is not a list")
        ckpt_io.load_weights(self.model, state["model"], self.ckpt_path)
        for name, part in (("optimizer", self.optimizer), ("scheduler", self.scheduler)):
            try:
                part.load_state_dict(state[name])
            except ckpt_io.MALFORMED as e:
                raise ValueError(
                    f"{self.ckpt_path} cannot be resumed: its {name} entry does not fit ({ckpt_io.first_line(e)})"
                ) from None
        self.position, self.history, self.rng = dict(position), list(state["history"]), state["rng"]
        if isinstance(state.get(RUN_ID), str):  # checkpoints written before run ids keep the new one
            self.run_id = state[RUN_ID]
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.task.load_state_dict(state.get("task_state", {}))
        if self.ema is not None:
            if "ema" not in state:
                raise ValueError(f"--ema_decay={self.cfg.run.ema_decay} but {self.ckpt_path} was trained without it")
            self.ema.load_checkpoint_state(state["ema"])
        try:
            ckpt_io.set_rng_state(self.rng)
        except ckpt_io.MALFORMED as e:
            raise ValueError(
                f"{self.ckpt_path} cannot be resumed: its rng entry is not a saved RNG state ({ckpt_io.first_line(e)})"
            ) from None

    def _trim_metrics(self) -> None:
        """Drop metrics records past the checkpoint (a resumed run writes them again), and a torn
        last line of a killed write."""
        path = self.out / "metrics.jsonl"
        if not path.exists():
            return
        keep = [r for r in read_metrics(path) if r.get("step", 0) <= self.position["step"]]
        if self.position["step"] == 0:
            keep = []
        path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def log(self, record: dict) -> None:
        if not self.main_process:
            return
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({**record, RUN_ID: self.run_id}) + "\n")

    # ---- the loop ---------------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list:
        """This process's training batches of `epoch` (lists of example indices)."""
        return self.task.batch_indices("train", self.cfg, epoch)

    def autocast(self):
        """bf16 autocast on CUDA; CPU trains in fp32."""
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    def train_step(self, batch) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss, stats = self.task.loss(self.model, batch, self.cfg)
        self.check_finite(loss)
        loss.backward()
        self.optimizer_step()
        return stats

    def check_finite(self, loss: torch.Tensor) -> None:
        """NonFiniteLoss (before any update) when the loss is NaN or infinite."""
        if not bool(torch.isfinite(loss.detach())):
            pos = self.position
            kept = (
                f"--out {self.cfg.run.out} keeps the run it held. Lower --lr_factor or raise --warmup and start again"
                if self.staging is not None  # an --overwrite run before its first epoch ended
                else f"{self.ckpt_path} holds the last good state. Lower --lr_factor or raise --warmup, then "
                "--resume or start again"
            )
            raise NonFiniteLoss(
                f"the training loss became {loss.item()} at step {pos['step'] + 1} (epoch "
                f"{pos['epoch'] + 1}); stopped without saving, {kept}"
            )

    def optimizer_step(self) -> None:
        """Clip, step, schedule and average (the gradients are in .grad)."""
        if self.cfg.run.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.run.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)

    def eval_model(self) -> torch.nn.Module:
        """The model to evaluate: the moving average's copy when ema_decay > 0, else the model."""
        return self.ema.module if self.ema is not None else self.model

    def fit(self) -> str:
        """Train to cfg.epochs (or cfg.max_steps, or cfg.time_budget_min). Returns "finished",
        "max_steps", "time_budget" or "interrupted"."""
        from tqdm.auto import tqdm

        self.model.train()
        self._fit_start = time.perf_counter()
        try:
            return self._fit(tqdm)
        finally:
            self.train_seconds, self._fit_start = self.elapsed(), None

    def _fit(self, tqdm) -> str:
        cfg, pos = self.cfg.run, self.position
        with deferred_interrupt(self.after_interrupt) as flag:
            self.stop = flag
            try:
                while pos["epoch"] < cfg.epochs:
                    if self.out_of_time():  # a resumed run whose budget is already spent
                        return "time_budget"
                    batches = self.epoch_batches(pos["epoch"])
                    meter, log_meter = Meter(), Meter()
                    first_batch = pos["batch"]  # > 0 when this run resumed in the middle of the epoch
                    bar = tqdm(
                        total=len(batches),
                        initial=pos["batch"],
                        disable=not (cfg.progress and self.main_process),
                        desc=f"epoch {pos['epoch'] + 1}/{cfg.epochs}",
                        dynamic_ncols=True,
                        leave=True,
                    )
                    while pos["batch"] < len(batches):
                        if cfg.max_steps and pos["step"] >= cfg.max_steps:
                            bar.close()
                            self.save(started=True)
                            return "max_steps"
                        batch = self.task.make_batch("train", batches[pos["batch"]], self.device)
                        stats = self.train_step(batch)
                        pos["batch"] += 1
                        pos["step"] += 1
                        self.rng = ckpt_io.rng_state()  # the state a resumed run must start from
                        meter.add(stats)
                        log_meter.add(stats)
                        bar.update(1)
                        if pos["step"] % 10 == 0 or pos["batch"] == len(batches):
                            s = meter.summary()
                            bar.set_postfix(
                                loss=f"{s['loss']:.3f}",
                                acc=f"{s['accuracy']:.3f}",
                                tok_s=f"{s['tokens_per_s']:.0f}",
                                lr=f"{self.scheduler.get_last_lr()[0]:.2e}",
                            )
                        if cfg.log_every and pos["step"] % cfg.log_every == 0:
                            self.log(
                                {
                                    "kind": "train",
                                    "epoch": pos["epoch"],
                                    "step": pos["step"],
                                    "lr": self.scheduler.get_last_lr()[0],
                                    **log_meter.summary(),
                                }
                            )
                            log_meter = Meter()
                        if cfg.checkpoint_every and pos["step"] % cfg.checkpoint_every == 0:
                            self.save()
                        if flag["stop"]:
                            raise KeyboardInterrupt
                        if self.out_of_time():
                            bar.close()
                            self.end_epoch(meter, first_batch)  # validate the cut-short epoch; resume starts the next
                            if flag["stop"]:  # it came during the validation
                                raise KeyboardInterrupt
                            return "time_budget"
                    bar.close()
                    self.end_epoch(meter, first_batch)
                    if flag["stop"]:  # it came during the validation: stop before the next step (or the test)
                        raise KeyboardInterrupt
                if cfg.max_steps and pos["step"] >= cfg.max_steps:
                    self.save(started=True)
                return "finished"
            except KeyboardInterrupt:
                if self.staging is not None:  # an --overwrite run that has not started: cli.py removes it
                    print(
                        f"interrupted at step {pos['step']}, before the new run's first epoch ended: --out {cfg.out} "
                        f"keeps the run it held, and the new run is discarded",
                        file=sys.stderr,
                    )
                    return "interrupted"
                self.save()  # weights, optimizer and RNG as after the last completed step
                print(
                    f"interrupted at step {pos['step']}; checkpoint saved to {self.ckpt_path}; "
                    f"continue with: sparseattn train --out {cfg.out} --resume",
                    file=sys.stderr,
                )
                return "interrupted"

    def after_interrupt(self) -> str:
        """What follows the step an interrupt lets finish (the line deferred_interrupt prints)."""
        if self.staging is not None:
            out = self.cfg.run.out
            return f"discarding the new run, which has not finished its first epoch: --out {out} keeps its run"
        return "saving a checkpoint"

    def out_of_time(self) -> bool:
        budget = 60.0 * self.cfg.run.time_budget_min
        return budget > 0 and self.agree(self.elapsed() >= budget)

    def agree(self, flag: bool) -> bool:
        """The decision every process takes (one process: its own; DistributedTrainer: any rank's)."""
        return flag

    def end_epoch(self, meter: Meter, first_batch: int = 0) -> None:
        """Validate, log and checkpoint. The train summary covers batches first_batch.. of the epoch:
        after a resume in mid-epoch it says so with "from_batch"."""
        pos = self.position
        train = meter.summary() if meter.sums else {}
        if first_batch and train:
            train["from_batch"] = first_batch
        valid = {}
        model = self.eval_model()
        if self.main_process:  # under torchrun the other ranks go on to the next collective and wait
            valid = self.task.evaluate(model, "valid", self.cfg, decode=self.cfg.run.eval_decode)
        record = {
            "epoch": pos["epoch"] + 1,
            "step": pos["step"],
            "time_s": round(self.elapsed(), 1),
            "train": train,
            "valid": valid,
        }
        self.log({"kind": "valid", **record})
        score = best_score(valid)
        if self.cfg.run.keep_best and all(score > best_score(r["valid"]) for r in self.history):
            best = {k: v for k, v in self.state().items() if k not in ("optimizer", "scheduler", "rng", "ema")}
            ckpt_io.save_atomic(
                {**best, "model": model.state_dict(), "epoch": pos["epoch"] + 1, "score": score}, self.best_path
            )  # the evaluated weights, which evaluate/plot read
        self.history.append(record)
        if self.main_process:  # one line per epoch, with or without progress bars
            print(epoch_line(record, self.cfg.run.epochs), file=sys.stderr)
        pos["epoch"] += 1
        pos["batch"] = 0
        self.save(started=True)

    def finish(self) -> dict:
        """Decoded test metrics (results.json) and plots, with the best validation epoch's weights
        when keep_best is on (checkpoint.pt keeps the last epoch's for resuming)."""
        self.take_place()
        extra = {}
        if self.cfg.run.keep_best and self.best_path.exists():
            best = ckpt_io.load(self.best_path, self.device)
            self.model.load_state_dict(best["model"])
            extra = {"best_epoch": best["epoch"]}
        elif self.ema is not None:  # training is over: keep the averaged weights
            self.model.load_state_dict(self.ema.module.state_dict())
        results = self.task.evaluate(self.model, "test", self.cfg, decode=True)
        results = {
            "split": "test",
            "beam": self.cfg.run.beam,
            "train_seconds": round(self.train_seconds, 1),
            **extra,
            **results,
        }
        self.log({"kind": "test", "step": self.position["step"], **results})
        (self.out / "results.json").write_text(json.dumps({**results, RUN_ID: self.run_id}, indent=2) + "\n")
        if self.cfg.run.plots:
            from .plots import loss_curve

            paths = list(self.task.plot(self.model, self.cfg, self.out / "plots", self.history))
            if self.history:  # every trained epoch logged a validation loss
                records = read_metrics(self.out / "metrics.jsonl")
                paths.append(loss_curve(records, self.out / "plots" / "loss.png"))
            results["plots"] = [str(p) for p in paths]
        return results


EPOCH_LINE_KEYS = (
    "loss",
    "tf_accuracy",
    "token_accuracy",
    "sequence_accuracy",
    "precision",
    "recall",
    "f1",
    "bleu",
    "act_steps_mean",
)


def epoch_line(record: dict, epochs: int) -> str:
    """The one line printed at the end of each epoch: position, training loss and accuracy, and the
    main validation metrics (metrics.jsonl holds all of them)."""
    train, valid = record.get("train") or {}, record.get("valid") or {}
    seconds = record["time_s"]
    clock = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    parts = [f"epoch {record['epoch']}/{epochs}", f"step {record['step']}", clock]
    if "loss" in train:
        parts.append(f"train loss {train['loss']:.4f} acc {train.get('accuracy', float('nan')):.4f}")
    shown = [f"{k} {valid[k]:.4f}" for k in EPOCH_LINE_KEYS if isinstance(valid.get(k), (int, float))]
    parts.append(f"valid {' '.join(shown)}" if shown else "valid -")
    return " | ".join(parts)


def best_score(valid: dict) -> Tuple[float, float]:
    """Validation score for keep_best, higher is better: (chunk F1, else BLEU, else decoded sequence
    accuracy, else teacher-forced accuracy, else -loss; then -loss). The loss breaks ties of a
    saturated metric (an accuracy that stays at its ceiling for many epochs)."""
    neg_loss = -float(valid.get("loss", 0.0))
    for key in ("f1", "bleu", "sequence_accuracy", "tf_accuracy"):
        if key in valid:
            return float(valid[key]), neg_loss
    return neg_loss, 0.0
