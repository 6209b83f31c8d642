"""Text from a pre-trained GPT checkpoint: greedy or sampled continuation of a prompt, with a
key/value cache, stopping at end-of-text; seeded, so a sample can be reproduced."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from transformer_lab import tracking
from transformer_lab.checkpoints import load_task
from transformer_lab.errors import TransformerLabError
from transformer_lab.evaluation import log_into_training_run
from transformer_lab.utils.io import atomic_write_json, atomic_write_text
from transformer_lab.utils.validate import check_value


SETTING_TYPES = {"max_new_tokens": int, "num_samples": int, "temperature": float, "top_k": int | None,
                 "top_p": float | None}


def check_settings(cfg: DictConfig) -> None:
    """The sampling settings, each checked by name before the checkpoint is read."""
    for key, hint in SETTING_TYPES.items():
        check_value(key, cfg.get(key), hint)
    if cfg.strategy not in ("greedy", "sample"):
        raise TransformerLabError(f"strategy={cfg.strategy!r}: expected greedy or sample (beam search is not offered)")
    if cfg.max_new_tokens < 1:
        raise TransformerLabError(f"max_new_tokens={cfg.max_new_tokens}: must be at least 1")
    if cfg.num_samples < 1:
        raise TransformerLabError(f"num_samples={cfg.num_samples}: must be at least 1")
    if cfg.strategy == "sample" and not cfg.temperature > 0:
        raise TransformerLabError(f"temperature={cfg.temperature}: must be > 0 (strategy=greedy takes the argmax)")
    top_k, top_p = cfg.top_k, cfg.top_p
    if top_k is not None and top_k < 1:
        raise TransformerLabError(f"top_k={top_k}: must be at least 1, or null for no cut")
    if top_p is not None and not 0 < top_p <= 1:
        raise TransformerLabError(f"top_p={top_p}: must be in (0, 1], or null for no nucleus cut")


def generate(cfg: DictConfig) -> dict:
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    check_settings(cfg)
    if cfg.get("output"):  # samples are logged only when written
        tracking.check_tracking(cfg)
    task = load_task(cfg.checkpoint, GPTPretrainingTask, "pretrain_gpt")  # its tokenizer travels inside
    generator = torch.Generator().manual_seed(cfg.seed)

    start = time.perf_counter()
    new = task.predict([cfg.prompt] * cfg.num_samples, cfg.max_new_tokens, stop_at_eos=cfg.stop_at_eos,
                       strategy=cfg.strategy, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                       generator=generator, use_cache=cfg.use_cache)
    seconds = time.perf_counter() - start
    samples = [row["text"] for row in new]
    new_tokens = sum(len(row["token_ids"]) for row in new)

    result = {"prompt": cfg.prompt, "samples": samples, "strategy": cfg.strategy, "temperature": cfg.temperature,
              "top_k": cfg.top_k, "top_p": cfg.top_p, "seed": cfg.seed, "use_cache": cfg.use_cache,
              "new_tokens": new_tokens, "tokens_per_s": new_tokens / seconds}
    if cfg.get("output"):
        output = Path(cfg.output)
        atomic_write_json(output, result)
        text_path = output.with_suffix(".txt")
        atomic_write_text(text_path, "".join(f"--- sample {i} ---\n{cfg.prompt}{s}\n" for i, s in enumerate(samples)))
        log_into_training_run(cfg, {}, [output, text_path], artifact_path="samples")
    return result
