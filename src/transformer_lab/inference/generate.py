"""Text from a pre-trained GPT checkpoint: greedy or sampled continuation of a prompt, with a
key/value cache, stopping at end-of-text; seeded, so a sample can be reproduced. torch and Lightning
are imported by `generate`, not here: `check_settings` refuses a bad call before they load."""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig

from transformer_lab.inference.options import Option, check_option, task_options
from transformer_lab.utils.io import atomic_write_json, atomic_write_text
from transformer_lab.utils.validate import check_value


def check_settings(cfg: DictConfig) -> None:
    """The prompt and sampling settings, before the checkpoint is read: each by name and range as
    the text-generation pipeline checks its options (options.OPTIONS), and num_samples."""
    check_value("prompt", cfg.prompt, str)
    for name, rule in task_options("text-generation").items():
        if name in cfg:
            check_option(name, cfg[name], rule)
    check_option("num_samples", cfg.get("num_samples"), Option(int, minimum=1))


def generate(cfg: DictConfig) -> dict:
    check_settings(cfg)  # before torch and Lightning load
    import torch

    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.gpt import GPTPretrainingTask
    from transformer_lab.tracking import runs as tracking
    from transformer_lab.tracking.evaluations import log_into_training_run

    if cfg.get("output"):  # samples are logged only when written
        tracking.check_tracking(cfg)
    task = load_task(cfg.checkpoint, GPTPretrainingTask, "pretrain_gpt")  # its tokenizer travels inside
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None

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
