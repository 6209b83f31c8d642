"""Text from a pre-trained GPT checkpoint: greedy or sampled continuation of a prompt, with a
key/value cache, stopping at end-of-text; seeded, so a sample can be reproduced."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from transformer_lab import tracking
from transformer_lab.data.tokenizers import END_OF_TEXT, load_tokenizer
from transformer_lab.errors import TransformerLabError
from transformer_lab.checkpoints import load_task
from transformer_lab.evaluate import mlflow_run_for
from transformer_lab.utils.io import atomic_write_json, atomic_write_text


def check_settings(cfg: DictConfig) -> None:
    """The sampling settings, each checked by name before the checkpoint is read."""
    def number(key: str, kind: type = float):
        value = cfg.get(key)
        accepted = (int, float) if kind is float else int
        if value is not None and (isinstance(value, bool) or not isinstance(value, accepted)):
            raise TransformerLabError(f"{key}={value!r}: expected {'a number' if kind is float else 'an integer'}")
        return value

    if cfg.strategy not in ("greedy", "sample"):
        raise TransformerLabError(f"strategy={cfg.strategy!r}: expected greedy or sample (beam search is not offered)")
    if number("max_new_tokens", int) < 1:
        raise TransformerLabError(f"max_new_tokens={cfg.max_new_tokens}: must be at least 1")
    if number("num_samples", int) < 1:
        raise TransformerLabError(f"num_samples={cfg.num_samples}: must be at least 1")
    if cfg.strategy == "sample" and not number("temperature") > 0:
        raise TransformerLabError(f"temperature={cfg.temperature}: must be > 0 (strategy=greedy takes the argmax)")
    top_k, top_p = number("top_k", int), number("top_p")
    if top_k is not None and top_k < 1:
        raise TransformerLabError(f"top_k={top_k}: must be at least 1, or null for no cut")
    if top_p is not None and not 0 < top_p <= 1:
        raise TransformerLabError(f"top_p={top_p}: must be in (0, 1], or null for no nucleus cut")


def generate(cfg: DictConfig) -> dict:
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    check_settings(cfg)
    if cfg.get("output") and cfg.get("logger"):
        tracking.check_tracking_server(cfg.paths.mlflow_tracking_uri)
    task = load_task(cfg.checkpoint, GPTPretrainingTask, "pretrain_gpt")
    model = task.model.eval()
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    if tokenizer.get_vocab_size() != model.config.vocab_size:
        raise TransformerLabError(f"{cfg.tokenizer_path}: {tokenizer.get_vocab_size()} tokens, but the checkpoint's "
                                  f"vocabulary has {model.config.vocab_size}; use the tokenizer it was trained with")
    eos_id = tokenizer.token_to_id(END_OF_TEXT)
    # an empty prompt starts a new document, as GPT-2 does: after an end-of-text token
    prompt_ids = tokenizer.encode(cfg.prompt, add_special_tokens=False).ids if cfg.prompt else [eos_id]
    prompt = torch.tensor([prompt_ids] * cfg.num_samples)
    generator = torch.Generator().manual_seed(cfg.seed)

    start = time.perf_counter()
    new = model.generate(prompt, cfg.max_new_tokens, cfg.strategy, cfg.temperature, cfg.top_k, cfg.top_p,
                         eos_id=eos_id if cfg.stop_at_eos else None, generator=generator, use_cache=cfg.use_cache)
    seconds = time.perf_counter() - start
    samples = []
    for row in new.tolist():
        if cfg.stop_at_eos and eos_id in row:
            row = row[:row.index(eos_id)]
        samples.append(tokenizer.decode(row))

    result = {"prompt": cfg.prompt, "samples": samples, "strategy": cfg.strategy, "temperature": cfg.temperature,
              "top_k": cfg.top_k, "top_p": cfg.top_p, "seed": cfg.seed, "use_cache": cfg.use_cache,
              "new_tokens": int(new.numel()), "tokens_per_s": new.numel() / seconds}
    if cfg.get("output"):
        output = Path(cfg.output)
        atomic_write_json(output, result)
        text_path = output.with_suffix(".txt")
        atomic_write_text(text_path, "".join(f"--- sample {i} ---\n{cfg.prompt}{s}\n" for i, s in enumerate(samples)))
        if cfg.get("logger"):
            client, run_id = mlflow_run_for(cfg, tracking.read_run_reference(cfg.run_reference))
            for path in (output, text_path):
                client.log_artifact(run_id, str(path), "samples")
    return result
