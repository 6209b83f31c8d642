"""This project's BERT and GPT against Hugging Face `transformers`' BertForPreTraining and
GPT2LMHeadModel, same weights.

    python benchmarks/hf_parity.py --out results.json [--models both] [--size mini] [--gpt-size mini]
                                   [--repeat 3] [--steps 20] [--warmup 2] [--batch-size 32]
                                   [--seq-len 128]

`--models` picks bert, gpt or both (default); each writes only its own keys.

BERT: a randomly initialised `transformers.BertForPreTraining` of the named size (`--size`;
vocabulary 8,000, 512 positions; nothing is downloaded) is converted with `from_hf_state_dict`
into ours.

Parity: both in eval mode on one random batch with segment ids and padded rows; writes the
largest absolute difference over last hidden states, MLM logits and NSP logits
(`bert_max_abs_diff`, and each in `parity`).

Throughput: `--steps` training steps (forward, MLM cross-entropy on ~15% of positions (ours
through `tasks/losses.py`, as the pre-training task), NSP cross-entropy, backward, fused AdamW step,
zero_grad) after `--warmup` untimed ones, in train mode with dropout 0.1, on full-length random
batches, 2 threads. Both compute the vocabulary projection only at the chosen positions (ours:
`mlm_positions=`; Hugging Face: `hf.bert`, then `hf.cls.predictions(hidden[chosen])` and
`hf.cls.seq_relationship(pooled)`); ours, given `mlm_positions`, also computes its last layer
only at those positions and [CLS], the rows the loss reads (the same loss and gradients,
`tests/test_bert.py`), where `hf.bert` computes every position. Each of the `--repeat` repeats starts both from the same
weights and has them take turns step by step; writes tokens/second (batch * seq_len * steps /
seconds; medians over repeats), the median of the per-repeat ratio ours/HF, and the median of
the per-step ratio (`..._by_step`).

GPT: a randomly initialised `transformers.GPT2LMHeadModel` of one of our GPT's named sizes
(`--gpt-size`; pre-norm, vocabulary 8,000, 512 positions, gelu_new = ours' gelu_tanh, dropout
0.1 on embeddings, attention probabilities and sublayer outputs, LM head tied to the token
embedding) is converted with `transformer_lab.models.gpt.from_hf_state_dict` into ours.

Parity: both in eval mode on one random batch of token ids (no padding; causal); writes the
largest absolute difference of the next-token logits (`gpt_max_abs_diff`, `gpt_parity`).

Throughput: as for BERT (same --repeat, --steps, --warmup, --batch-size, --seq-len, turns
and medians), with the next-token cross-entropy over every position that has a next token as
the loss, from the full logits (ours: `model(ids).logits` through the GPT task's `lm_loss`,
the cheaper-backward cross-entropy of `tasks/losses.py`; Hugging Face:
`model(input_ids=ids).logits` through `F.cross_entropy`, as its ForCausalLMLoss; the same
value, `tests/test_losses.py`); writes `gpt_ours_tokens_per_s`, `gpt_hf_tokens_per_s`,
`gpt_ours_to_hf_speed`, `gpt_ours_to_hf_speed_by_step` and `gpt_all_speeds`, with the GPT
settings under `settings["gpt"]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

VOCAB_SIZE = 8000
MAX_POSITIONS = 512
MASK_PROB = 0.15
LR = 1e-4
DROPOUT = 0.1  # BERT's and GPT-2's, on embeddings, attention probabilities and sublayer outputs
THREADS = 2
TIMING = ("per repeat: fresh copies of the same weights, warmup steps, then steps with "
          "ours and hf taking turns step by step (first mover swapping)")


def reference_config(size: str, dropout: float):
    """A `transformers.BertConfig` of one of this project's named sizes."""
    from transformers import BertConfig as HFBertConfig

    from transformer_lab.models.bert import SIZES

    layers, hidden, heads = SIZES[size]
    return HFBertConfig(vocab_size=VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden,
                        max_position_embeddings=MAX_POSITIONS, type_vocab_size=2, hidden_act="gelu",
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        layer_norm_eps=1e-12, pad_token_id=0)


def reference_gpt_config(size: str, dropout: float):
    """A `transformers.GPT2Config` of one of this project's named (pre-norm) GPT sizes."""
    from transformers import GPT2Config

    from transformer_lab.models.gpt import SIZES

    layers, hidden, heads, norm_first = SIZES[size]
    if not norm_first:
        raise ValueError(f"GPT size {size!r} is post-norm (GPT-1); GPT-2 is pre-norm")
    # bos/eos inside the vocabulary (the default 50256 is not), else transformers warns
    return GPT2Config(vocab_size=VOCAB_SIZE, n_positions=MAX_POSITIONS, n_embd=hidden, n_layer=layers,
                      n_head=heads, n_inner=4 * hidden, activation_function="gelu_new",
                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                      layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0)


def hf_class(kind: str):
    """Hugging Face's model class for kind "bert" or "gpt"."""
    if kind == "bert":
        from transformers import BertForPreTraining
        return BertForPreTraining
    from transformers import GPT2LMHeadModel
    return GPT2LMHeadModel


def paired_models(hf_config, hf_state: dict, kind: str = "bert"):
    """(ours, theirs), both holding exactly hf_state's weights (separate copies)."""
    if kind == "bert":
        from transformer_lab.models import bert as module
        ours_class = module.BertForPreTraining
    else:
        from transformer_lab.models import gpt as module
        ours_class = module.GPTLMHeadModel

    theirs = hf_class(kind)(hf_config)
    theirs.load_state_dict(hf_state, strict=True)
    ours = ours_class(module.config_from_hf(hf_config))
    ours.load_state_dict(module.from_hf_state_dict(hf_state), strict=True)
    return ours, theirs


def random_batch(generator, batch_size: int, seq_len: int, padded: bool) -> dict:
    """Random tokens (never the pad id), a random A/B split per row, ~15% chosen MLM positions
    (at least one) and random MLM/NSP targets. padded=True shortens every other row."""
    import torch

    ids = torch.randint(1, VOCAB_SIZE, (batch_size, seq_len), generator=generator)
    positions = torch.arange(seq_len)
    if padded:
        lengths = torch.randint(seq_len // 4, seq_len, (batch_size,), generator=generator)
        lengths[::2] = seq_len
    else:
        lengths = torch.full((batch_size,), seq_len)
    mask = positions < lengths[:, None]
    split = (lengths * torch.rand(batch_size, generator=generator)).long().clamp(min=1)
    segments = (positions >= split[:, None]).long() * mask
    ids = ids * mask  # padding = pad id 0
    chosen = (torch.rand(batch_size, seq_len, generator=generator) < MASK_PROB) & mask
    chosen[0, 1] = True
    return {"input_ids": ids, "segment_ids": segments, "attention_mask": mask, "chosen": chosen,
            "mlm_targets": torch.randint(1, VOCAB_SIZE, (int(chosen.sum()),), generator=generator),
            "is_next": torch.randint(0, 2, (batch_size,), generator=generator)}


def random_gpt_batch(generator, batch_size: int, seq_len: int) -> dict:
    """Random token ids over the whole vocabulary, full length (a causal LM needs no padding)."""
    import torch

    return {"input_ids": torch.randint(0, VOCAB_SIZE, (batch_size, seq_len), generator=generator)}


def parity(ours, theirs, batch: dict) -> dict[str, float]:
    import torch

    ours.eval()
    theirs.eval()
    with torch.no_grad():
        out = ours(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        hidden, mlm, nsp = out.hidden_states, out.logits, out.nsp_logits
        ref = theirs(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                     attention_mask=batch["attention_mask"].long(), output_hidden_states=True)
    return {"hidden": (hidden - ref.hidden_states[-1]).abs().max().item(),
            "mlm_logits": (mlm - ref.prediction_logits).abs().max().item(),
            "nsp_logits": (nsp - ref.seq_relationship_logits).abs().max().item()}


def gpt_parity(ours, theirs, batch: dict) -> dict[str, float]:
    import torch

    ours.eval()
    theirs.eval()
    with torch.no_grad():
        logits = ours(batch["input_ids"]).logits
        ref = theirs(input_ids=batch["input_ids"]).logits
    return {"logits": (logits - ref).abs().max().item()}


def ours_logits(model, batch: dict):
    out = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], mlm_positions=batch["chosen"])
    return out.logits, out.nsp_logits


def hf_logits(model, batch: dict):
    # HF's BertForPreTraining.forward projects every position onto the vocabulary; its
    # submodules let it select the chosen positions first, as ours does.
    out = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                     attention_mask=batch["attention_mask"].long())
    return (model.cls.predictions(out.last_hidden_state[batch["chosen"]]),
            model.cls.seq_relationship(out.pooler_output))


def bert_loss(mlm, nsp, batch: dict, mlm_loss=None):
    """MLM cross-entropy at the chosen positions plus NSP cross-entropy; `mlm_loss` for the
    MLM term (default: F.cross_entropy, as `transformers`' BertForPreTraining)."""
    import torch.nn.functional as F

    return (mlm_loss or F.cross_entropy)(mlm, batch["mlm_targets"]) + F.cross_entropy(nsp, batch["is_next"])


def ours_bert_loss(model, batch: dict):
    from transformer_lab.tasks.losses import cross_entropy  # as BertPretrainingTask trains

    return bert_loss(*ours_logits(model, batch), batch, mlm_loss=cross_entropy)


def hf_bert_loss(model, batch: dict):
    return bert_loss(*hf_logits(model, batch), batch)


def next_token_targets(input_ids):
    """Token t+1 as the target of position t; the last position has none (-100, ignored). The
    targets are shifted, not the logits, as in this project's GPT task and `transformers`'
    ForCausalLMLoss: slicing the logits would copy them."""
    import torch.nn.functional as F

    return F.pad(input_ids[:, 1:], (0, 1), value=-100)


def torch_next_token_loss(logits, input_ids):
    """The next-token loss through F.cross_entropy, as `transformers`' ForCausalLMLoss computes it."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), next_token_targets(input_ids).reshape(-1),
                           ignore_index=-100)


def ours_gpt_loss(model, batch: dict):
    from transformer_lab.tasks.gpt import lm_loss  # the GPT task's own loss

    return lm_loss(model(batch["input_ids"]).logits, next_token_targets(batch["input_ids"]))


def hf_gpt_loss(model, batch: dict):
    # no labels=: HF would shift and average itself with F.cross_entropy, as here
    return torch_next_token_loss(model(input_ids=batch["input_ids"]).logits, batch["input_ids"])


def ours_bert_torch_loss(model, batch: dict):
    return bert_loss(*ours_logits(model, batch), batch)


def ours_bert_full_last_layer_loss(model, batch: dict):
    """Ours with the last layer at every position, as `transformers` computes it (mlm_positions
    limits the last layer to the chosen positions and [CLS]): the same loss, more work."""
    from transformer_lab.tasks.losses import cross_entropy

    hidden, pooled, _ = model.bert(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    return bert_loss(model.mlm(hidden[batch["chosen"]]), model.nsp(pooled), batch, mlm_loss=cross_entropy)


def ours_gpt_torch_loss(model, batch: dict):
    return torch_next_token_loss(model(batch["input_ids"]).logits, batch["input_ids"])


# ours with F.cross_entropy instead of the project's loss: what the cheaper backward alone gains
OURS_WITH_TORCH_LOSS = {"bert": ours_bert_torch_loss, "gpt": ours_gpt_torch_loss}


RUNNERS = {"bert": {"ours": ours_bert_loss, "hf": hf_bert_loss},
           "gpt": {"ours": ours_gpt_loss, "hf": hf_gpt_loss}}


def step_seconds(models: dict, runners: dict, batches: list[dict], warmup: int, steps: int,
                 bf16: bool = False) -> dict[str, list[float]]:
    """Seconds of each of `steps` training steps per model, after `warmup` untimed ones.

    runners[name](model, batch) returns the loss of one forward. The models take turns step by
    step (who goes first swaps every step), so that load from other processes on the machine
    falls on both alike; batches are reused in turn. On a GPU each step is timed to its end
    (synchronised); bf16: the forward under bf16 autocast. The optimizer is fused AdamW.
    """
    import torch

    device = next(next(iter(models.values())).parameters()).device
    # fused AdamW for both, as each trains by default: the project's tasks (tasks/schedules.py) and
    # `transformers`' Trainer (optim "adamw_torch_fused" on torch >= 2.8)
    fused = device.type in ("cpu", "cuda")
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=LR, fused=fused) for name, model in models.items()}
    for model in models.values():
        model.train()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds = {name: [] for name in models}
    names = list(models)
    for step in range(warmup + steps):
        batch = batches[step % len(batches)]
        for name in names if step % 2 == 0 else names[::-1]:
            synchronize()
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = runners[name](models[name], batch)
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad()
            synchronize()
            if step >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def throughput(kind: str, hf_config, initial: dict, batches: list[dict], args) -> tuple[dict, list[float]]:
    """Tokens/second per repeat for ours and hf, and the per-step ratios hf seconds / ours seconds."""
    tokens = args.batch_size * args.seq_len * args.steps
    speeds, step_ratios = {"ours": [], "hf": []}, []
    for repeat in range(args.repeat):
        models = dict(zip(["ours", "hf"], paired_models(hf_config, initial, kind)))  # same start each repeat
        seconds = step_seconds(models, RUNNERS[kind], batches, args.warmup, args.steps)
        for name in speeds:
            speeds[name].append(tokens / sum(seconds[name]))
        step_ratios += [h / o for o, h in zip(seconds["ours"], seconds["hf"])]
        print(f"{kind} repeat {repeat + 1}: ours {speeds['ours'][-1]:,.0f} tokens/s, "
              f"hf {speeds['hf'][-1]:,.0f} tokens/s", flush=True)
    return speeds, step_ratios


def speed_results(prefix: str, speeds: dict, step_ratios: list[float]) -> dict:
    return {
        f"{prefix}_ours_tokens_per_s": round(statistics.median(speeds["ours"])),
        f"{prefix}_hf_tokens_per_s": round(statistics.median(speeds["hf"])),
        # Within a repeat both train step by step in turn, so the ratio cancels load that changes over time.
        f"{prefix}_ours_to_hf_speed": round(statistics.median(o / h for o, h in zip(speeds["ours"], speeds["hf"])), 3),
        # The same from adjacent steps: a burst of load that falls on a few of one model's
        # steps moves this less (the machine is shared).
        f"{prefix}_ours_to_hf_speed_by_step": round(statistics.median(step_ratios), 3),
    }


def all_speeds(speeds: dict) -> dict:
    return {name: [round(s) for s in values] for name, values in speeds.items()}


def run_bert(args) -> tuple[dict, dict]:
    """BERT's result keys and settings."""
    import torch

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    hf_config = reference_config(args.size, DROPOUT)
    initial = hf_class("bert")(hf_config).state_dict()  # HF's own random initialisation

    ours, theirs = paired_models(hf_config, initial, "bert")
    diffs = parity(ours, theirs, random_batch(generator, args.batch_size, args.seq_len, padded=True))
    print(f"bert parity: {diffs}", flush=True)

    batches = [random_batch(generator, args.batch_size, args.seq_len, padded=False) for _ in range(4)]
    speeds, step_ratios = throughput("bert", hf_config, initial, batches, args)
    result = {"bert_max_abs_diff": max(diffs.values()), "parity": diffs,
              **speed_results("bert", speeds, step_ratios), "all_speeds": all_speeds(speeds)}
    settings = {
        "layers_hidden_heads": [hf_config.num_hidden_layers, hf_config.hidden_size, hf_config.num_attention_heads],
        "dropout": DROPOUT, "mlm_prob": MASK_PROB,
        "mlm_loss": "vocabulary projection at the chosen positions only, for both; ours' last layer at those "
                    "positions and [CLS] only "
                    "(ours: mlm_positions=; hf: hf.bert -> hf.cls.predictions(hidden[chosen]), "
                    "hf.cls.seq_relationship(pooled))",
        "attention_mask": "all-true boolean mask while training (ours: bool; hf: long)",
        "hf_attn_implementation": theirs.config._attn_implementation,
        "params": sum(p.numel() for p in ours.parameters()),
    }
    return result, settings


def run_gpt(args) -> tuple[dict, dict]:
    """GPT's result keys and its settings (settings["gpt"])."""
    import torch

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    hf_config = reference_gpt_config(args.gpt_size, DROPOUT)
    initial = hf_class("gpt")(hf_config).state_dict()  # HF's own random initialisation

    ours, theirs = paired_models(hf_config, initial, "gpt")
    diffs = gpt_parity(ours, theirs, random_gpt_batch(generator, args.batch_size, args.seq_len))
    print(f"gpt parity: {diffs}", flush=True)

    batches = [random_gpt_batch(generator, args.batch_size, args.seq_len) for _ in range(4)]
    speeds, step_ratios = throughput("gpt", hf_config, initial, batches, args)
    result = {"gpt_max_abs_diff": max(diffs.values()), "gpt_parity": diffs,
              **speed_results("gpt", speeds, step_ratios), "gpt_all_speeds": all_speeds(speeds)}
    settings = {
        "size": args.gpt_size, "vocab_size": VOCAB_SIZE, "max_positions": hf_config.n_positions,
        "layers_hidden_heads": [hf_config.n_layer, hf_config.n_embd, hf_config.n_head],
        "norm_first": True, "activation": "hf gelu_new = ours gelu_tanh",
        "dropout": DROPOUT, "optimizer": f"AdamW (fused) lr={LR}", "threads": THREADS,
        "lm_loss": "next-token cross-entropy over positions 0..seq_len-2, full vocabulary projection, "
                   "computed the same way for both (ours: model(ids).logits; hf: model(input_ids=ids).logits)",
        "tied_lm_head": True, "timing": TIMING,
        "hf_attn_implementation": theirs.config._attn_implementation,
        "params": sum(p.numel() for p in ours.parameters()),
    }
    return result, settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--models", choices=["bert", "gpt", "both"], default="both",
                        help="which comparisons to run (default: both)")
    parser.add_argument("--size", choices=["tiny", "mini", "small"], default="mini", help="BERT size")
    parser.add_argument("--gpt-size", choices=["tiny", "mini"], default="mini",
                        help="GPT size (transformer_lab.models.gpt.SIZES)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per model per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps before them")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 2 <= args.seq_len <= MAX_POSITIONS:
        parser.error(f"--seq-len must be in 2..{MAX_POSITIONS}")
    if min(args.repeat, args.steps, args.batch_size) < 1 or args.warmup < 0:
        parser.error("--repeat, --steps and --batch-size must be at least 1, --warmup at least 0")

    import torch
    import transformers

    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.memory import keep_freed_memory

    load_before = os.getloadavg()[0]
    torch.set_num_threads(THREADS)
    result = {}
    settings = {**vars(args), "keep_freed_memory": keep_freed_memory(),  # as the pipelines train; both alike
                "vocab_size": VOCAB_SIZE, "max_positions": MAX_POSITIONS,
                "optimizer": f"AdamW (fused) lr={LR}", "threads": THREADS, "timing": TIMING}
    if args.models in ("bert", "both"):
        bert_result, bert_settings = run_bert(args)
        result.update(bert_result)
        settings.update(bert_settings)
    if args.models in ("gpt", "both"):
        gpt_result, settings["gpt"] = run_gpt(args)
        result.update(gpt_result)

    result["settings"] = settings
    result["machine"] = {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         # other work on the machine slows both; the ratio is the robust figure
                         "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
