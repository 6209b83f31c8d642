"""This project's BERT against Hugging Face `transformers`' BertForPreTraining, same weights.

    python benchmarks/hf_parity.py --out results.json [--size mini] [--repeat 3] [--steps 20]
                                   [--warmup 2] [--batch-size 32] [--seq-len 128]

A randomly initialised `transformers.BertForPreTraining` of the named size (vocabulary 8,000,
512 positions; nothing is downloaded) is converted with `from_hf_state_dict` into ours.

Parity: both in eval mode on one random batch with segment ids and padded rows; writes the
largest absolute difference over last hidden states, MLM logits and NSP logits
(`bert_max_abs_diff`, and each in `parity`).

Throughput: `--steps` training steps (forward, MLM cross-entropy on ~15% of positions, NSP
cross-entropy, backward, AdamW step, zero_grad) after `--warmup` untimed ones, in train mode
with dropout 0.1, on full-length random batches, 2 threads. Both compute the vocabulary
projection only at the chosen positions (ours: `mlm_positions=`; Hugging Face: `hf.bert`, then
`hf.cls.predictions(hidden[chosen])` and `hf.cls.seq_relationship(pooled)`). Each of the
`--repeat` repeats starts both from the same weights and has them take turns step by step;
writes tokens/second (batch * seq_len * steps / seconds; medians over repeats), the median
of the per-repeat ratio ours/HF, and the median of the per-step ratio (`..._by_step`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

VOCAB_SIZE = 8000
MAX_POSITIONS = 512
MASK_PROB = 0.15
LR = 1e-4
DROPOUT = 0.1  # BERT's, on embeddings, attention probabilities and sublayer outputs


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


def paired_models(hf_config, hf_state: dict):
    """(ours, theirs), both holding exactly hf_state's weights (separate copies)."""
    from transformers import BertForPreTraining as HFBertForPreTraining

    from transformer_lab.models.bert import BertForPreTraining, config_from_hf, from_hf_state_dict

    theirs = HFBertForPreTraining(hf_config)
    theirs.load_state_dict(hf_state, strict=True)
    ours = BertForPreTraining(config_from_hf(hf_config))
    ours.load_state_dict(from_hf_state_dict(hf_state), strict=True)
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


def parity(ours, theirs, batch: dict) -> dict[str, float]:
    import torch

    ours.eval()
    theirs.eval()
    with torch.no_grad():
        hidden, mlm, nsp = ours(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        ref = theirs(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                     attention_mask=batch["attention_mask"].long(), output_hidden_states=True)
    return {"hidden": (hidden - ref.hidden_states[-1]).abs().max().item(),
            "mlm_logits": (mlm - ref.prediction_logits).abs().max().item(),
            "nsp_logits": (nsp - ref.seq_relationship_logits).abs().max().item()}


def ours_logits(model, batch: dict):
    _, mlm, nsp = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"],
                        mlm_positions=batch["chosen"])
    return mlm, nsp


def hf_logits(model, batch: dict):
    # HF's BertForPreTraining.forward projects every position onto the vocabulary; its
    # submodules let it select the chosen positions first, as ours does.
    out = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                     attention_mask=batch["attention_mask"].long())
    return (model.cls.predictions(out.last_hidden_state[batch["chosen"]]),
            model.cls.seq_relationship(out.pooler_output))


def step_seconds(models: dict, runners: dict, batches: list[dict], warmup: int, steps: int) -> dict[str, list[float]]:
    """Seconds of each of `steps` training steps per model, after `warmup` untimed ones.

    The models take turns step by step (who goes first swaps every step), so that load from
    other processes on the machine falls on both alike; batches are reused in turn.
    """
    import torch
    import torch.nn.functional as F

    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=LR) for name, model in models.items()}
    for model in models.values():
        model.train()
    seconds = {name: [] for name in models}
    names = list(models)
    for step in range(warmup + steps):
        batch = batches[step % len(batches)]
        for name in names if step % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            mlm, nsp = runners[name](models[name], batch)
            loss = F.cross_entropy(mlm, batch["mlm_targets"]) + F.cross_entropy(nsp, batch["is_next"])
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad()
            if step >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--size", choices=["tiny", "mini", "small"], default="mini")
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
    from transformers import BertForPreTraining as HFBertForPreTraining

    from transformer_lab.utils.io import atomic_write_json

    load_before = os.getloadavg()[0]
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    hf_config = reference_config(args.size, DROPOUT)
    initial = HFBertForPreTraining(hf_config).state_dict()  # HF's own random initialisation

    ours, theirs = paired_models(hf_config, initial)
    diffs = parity(ours, theirs, random_batch(generator, args.batch_size, args.seq_len, padded=True))
    print(f"parity: {diffs}", flush=True)

    batches = [random_batch(generator, args.batch_size, args.seq_len, padded=False) for _ in range(4)]
    tokens = args.batch_size * args.seq_len * args.steps
    speeds, step_ratios = {"ours": [], "hf": []}, []
    runners = {"ours": ours_logits, "hf": hf_logits}
    for repeat in range(args.repeat):
        models = dict(zip(["ours", "hf"], paired_models(hf_config, initial)))  # same start each repeat
        seconds = step_seconds(models, runners, batches, args.warmup, args.steps)
        for name in speeds:
            speeds[name].append(tokens / sum(seconds[name]))
        step_ratios += [h / o for o, h in zip(seconds["ours"], seconds["hf"])]
        print(f"repeat {repeat + 1}: ours {speeds['ours'][-1]:,.0f} tokens/s, hf {speeds['hf'][-1]:,.0f} tokens/s",
              flush=True)

    result = {
        "bert_max_abs_diff": max(diffs.values()),
        "parity": diffs,
        "bert_ours_tokens_per_s": round(statistics.median(speeds["ours"])),
        "bert_hf_tokens_per_s": round(statistics.median(speeds["hf"])),
        # Within a repeat both train step by step in turn, so the ratio cancels load that changes over time.
        "bert_ours_to_hf_speed": round(statistics.median(o / h for o, h in zip(speeds["ours"], speeds["hf"])), 3),
        # The same from adjacent steps: a burst of load that falls on a few of one model's
        # steps moves this less (the machine is shared).
        "bert_ours_to_hf_speed_by_step": round(statistics.median(step_ratios), 3),
        "all_speeds": {name: [round(s) for s in values] for name, values in speeds.items()},
        "settings": {
            **vars(args), "vocab_size": VOCAB_SIZE, "max_positions": MAX_POSITIONS,
            "layers_hidden_heads": [hf_config.num_hidden_layers, hf_config.hidden_size, hf_config.num_attention_heads],
            "dropout": DROPOUT, "mlm_prob": MASK_PROB, "optimizer": f"AdamW lr={LR}", "threads": 2,
            "mlm_loss": "vocabulary projection at the chosen positions only, for both "
                        "(ours: mlm_positions=; hf: hf.bert -> hf.cls.predictions(hidden[chosen]), "
                        "hf.cls.seq_relationship(pooled))",
            "attention_mask": "all-true boolean mask while training (ours: bool; hf: long)",
            "timing": "per repeat: fresh copies of the same weights, warmup steps, then steps with "
                      "ours and hf taking turns step by step (first mover swapping)",
            "hf_attn_implementation": theirs.config._attn_implementation,
            "params": sum(p.numel() for p in ours.parameters()),
        },
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    # other work on the machine slows both; the ratio is the robust figure
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
    }
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
