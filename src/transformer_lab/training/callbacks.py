"""Lightning callbacks of this project."""

from __future__ import annotations

import csv
import io
import math
import os
import random
import shutil
import signal
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.utilities import rank_zero_info

from transformer_lab.utils.io import atomic_write_text


class MetricsHistory(L.Callback):
    """Appends each training epoch's logged metrics (train and validation) to a CSV, a DVC plot, on rank 0."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.rows: list[dict] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        row = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        for name, value in sorted(trainer.callback_metrics.items()):
            if value.numel() == 1 and not name.endswith("_step"):
                row[name.removesuffix("_epoch")] = round(float(value), 6)
        self.rows.append(row)
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, columns, restval=math.nan)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buffer.getvalue())

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict.get("rows", []))


class EarlyStoppingSteps(EarlyStopping):
    """Lightning's EarlyStopping with its patience counted in optimiser steps (patience_steps /
    steps per epoch, at least min_patience epochs) and an improvement measured relative to the best
    so far (min_delta_ratio). One setting then waits about as long on a table of 300 rows (a few
    steps an epoch) as on one of 100,000 (hundreds). Progress is an improvement by more than
    min_delta and by more than min_delta_ratio of the best so far, so a loss creeping towards 0
    on a separable table (0.0010 after 0.0011) stops counting."""

    def __init__(self, monitor: str, patience_steps: int = 200, min_patience: int = 3,
                 min_delta_ratio: float = 0.0, **kwargs):
        # judged after each validation, never at a training epoch's end: a run that max_steps ends
        # mid-epoch has no validation metric there yet, and Lightning would stop it with an error
        kwargs.setdefault("check_on_train_epoch_end", False)
        super().__init__(monitor=monitor, patience=min_patience, **kwargs)
        self.patience_steps, self.min_patience, self.min_delta_ratio = patience_steps, min_patience, min_delta_ratio
        self.min_delta_absolute = abs(self.min_delta)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        batches = trainer.num_training_batches
        steps = max(1, int(batches)) if math.isfinite(batches) else 1
        self.patience = max(self.min_patience, math.ceil(self.patience_steps / steps))

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        best = float(self.best_score)
        if self.min_delta_ratio and math.isfinite(best):
            # the sign convention of EarlyStopping.__init__: negative when smaller is better
            delta = max(self.min_delta_absolute, self.min_delta_ratio * abs(best))
            self.min_delta = delta if self.monitor_op == torch.gt else -delta
        return super()._evaluate_stopping_criteria(current)


class RandomState(L.Callback):
    """Every checkpoint carries the random generators' states (Python, NumPy, torch on the CPU and
    each GPU), and resuming restores them: the resumed run shuffles its data and draws its dropout
    masks exactly as the run that was never stopped. Plain tensors and numbers, so the checkpoint
    still loads with `weights_only=True`."""

    def state_dict(self) -> dict:
        version, python_state, gauss = random.getstate()
        kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
        return {
            "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64), "gauss": gauss},
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                      "has_gauss": int(has_gauss), "cached_gauss": float(cached_gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        python = state_dict["python"]
        random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
        numpy = state_dict["numpy"]
        np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                             numpy["has_gauss"], numpy["cached_gauss"]))
        torch.set_rng_state(state_dict["torch"])
        if state_dict["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


def submitit_job_id() -> str | None:
    """The id of the submitit job (a SLURM job, or one of submitit's local executor) this process runs
    in, which a requeued job keeps; None outside one."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    import submitit

    return submitit.JobEnvironment().job_id


def requeue_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """Where this submitit job saves its training state when it is requeued (None outside a job).
    Named by the job's id: only a later attempt of the same job resumes from it."""
    job_id = submitit_job_id()
    return Path(checkpoint_dir, f"requeue_{job_id}.ckpt") if job_id else None


class CheckpointOnRequeue(L.Callback):
    """A job of hydra/launcher=slurm (or local) that is sent its time-limit signal saves its training
    state at `path` before submitit requeues it; the job's next attempt resumes from it (train.py).

    submitit's handler of that signal (USR2, `signal_delay_s` before the limit) requeues the job and
    exits at once, wherever the training is: in the middle of an optimiser step. During training this
    callback holds the signal back: its handler only notes it; at the end of the batch in flight (where
    ModelCheckpoint's every_n_train_steps saves too, a point Lightning resumes from) every process saves
    the checkpoint, then submitit's handler runs as it would have. Before training starts and after it
    ends (the final scoring) submitit's handler acts alone."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.signum: int | None = None
        self.holding = False
        self.submitit_handler = None  # what the signal goes back to
        self.signalled = False
        self.requeued = False  # the checkpoint is saved and submitit's handler ran

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.path is None:  # not a submitit job
            return
        import submitit

        # every process holds it (also one Lightning started, where submitit installed no handler):
        # each of them takes part in the decision at every batch's end
        self.signum = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        self.submitit_handler = signal.signal(self.signum, self._note)
        self.holding = True

    def _note(self, signum: int, frame) -> None:
        self.signalled = True

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self._requeue_if_signalled(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._requeue_if_signalled(trainer)  # signalled during the last validation: no batch follows
        self._release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self):
        if self.holding:
            signal.signal(self.signum, self.submitit_handler)
            self.holding = False
        return self.submitit_handler

    def _requeue_if_signalled(self, trainer: L.Trainer) -> None:
        # one decision for all processes, whichever of them the signal reached first
        if not self.holding or not trainer.strategy.reduce_boolean_decision(self.signalled, all=False):
            return
        rank_zero_info(f"{signal.Signals(self.signum).name}: the job's time is nearly up; its state at step "
                       f"{trainer.global_step} goes to {self.path}, then submitit requeues it")
        partial = self.path.with_name(self.path.name + ".partial")
        trainer.save_checkpoint(partial, weights_only=False)  # the whole state: optimiser, loops, callbacks
        if trainer.is_global_zero:  # a save cut short by the kill never replaces a whole checkpoint
            if self.path.is_dir():  # a sharded checkpoint (FSDP, DeepSpeed) is a folder
                shutil.rmtree(self.path)
            os.replace(partial, self.path)
        self.requeued = True
        handler = self._release()
        if callable(handler):  # submitit's: the resubmission pickled, the job requeued, exit
            handler(self.signum, None)


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in matrix products: all of them except embedding tables that are
    only looked up (a table tied to an output layer is multiplied, and counts)."""
    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    lookups = sum(m.weight.numel() for m in model.modules()
                  if isinstance(m, torch.nn.Embedding) and id(m.weight) not in multiplied)
    return sum(p.numel() for p in model.parameters()) - lookups


def flops_per_token(n_params: int, n_layers: int, d_model: int, context: int) -> int:
    """Training FLOPs per token (forward + backward) of a transformer: 6N for the parameter
    matmuls plus 12·L·d·T for attention's scores and weighted sums over a context of T (as in
    Kaplan et al. 2020 and the PaLM paper's MFU appendix)."""
    return 6 * n_params + 12 * n_layers * d_model * context


class Throughput(L.Callback):
    """Logs perf/samples_per_s every `log_every_n_steps` training steps, summed over all
    processes; for batches of token ids also perf/tokens_per_s, and for transformer models
    (a `model.config` with n_layers and d_model) perf/flops_per_token and, where the device's
    peak is in `peak_tflops` (matched against the CUDA device name), perf/mfu: model FLOPs
    utilisation. No peak is known for CPUs, so no MFU there. On CUDA also perf/peak_memory_gib:
    the most memory this process's device has held for tensors so far."""

    def __init__(self, peak_tflops: dict[str, float] | None = None, log_every_n_steps: int = 10):
        self.peak_tflops = dict(peak_tflops or {})
        self.log_every_n_steps = log_every_n_steps
        self.n_params = 0
        self.shape: tuple[int, int] | None = None
        self.peak: float | None = None
        self._start = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        model = getattr(pl_module, "model", pl_module)
        config = getattr(model, "config", None)
        self.n_params = matmul_parameters(model)
        if config is not None and getattr(config, "n_layers", None) and getattr(config, "d_model", None):
            self.shape = (config.n_layers, config.d_model)
        self.peak = self.device_peak(pl_module.device)

    def device_peak(self, device: torch.device) -> float | None:
        """Peak FLOP/s of one device from the table, or None (CPU, or a GPU not in it)."""
        if device.type != "cuda":
            return None
        name = torch.cuda.get_device_name(device)
        for key, tflops in sorted(self.peak_tflops.items(), key=lambda item: -len(item[0])):
            if key.lower() in name.lower():
                return tflops * 1e12
        return None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (trainer.global_step + 1) % self.log_every_n_steps:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        seconds = time.perf_counter() - self._start
        world = trainer.world_size
        tokens = batch.get("input_ids") if isinstance(batch, dict) else None
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        values = {"perf/samples_per_s": len(first) * world / seconds}
        if tokens is not None:
            tokens_per_s = tokens.numel() * world / seconds
            values["perf/tokens_per_s"] = tokens_per_s
            if self.shape:
                per_token = flops_per_token(self.n_params, *self.shape, tokens.shape[-1])
                values["perf/flops_per_token"] = float(per_token)
                if self.peak:
                    values["perf/mfu"] = per_token * tokens_per_s / (self.peak * world)
        if pl_module.device.type == "cuda":
            values["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        pl_module.log_dict(values, on_step=True, on_epoch=False, rank_zero_only=True)
