"""ATIS benchmark: train the encoder on DIR/train + DIR/dev, score it on DIR/test; or, to choose
settings, train on DIR/train alone and score DIR/dev (--score dev).

    python benchmarks/atis.py --data ../shared/data/atis --out results/atis.json [--minutes 10] [--score dev]

DIR is any directory in the seq.in / seq.out / label layout. The model and optimiser come
from `experiment=atis/full` (override with --set key=value); no pretrained weights. Writes
intent_acc, slot_f1, sentence_acc, token_acc, non_o_token_acc (fractions in 0-1),
train_seconds, params (trainable_params: without a frozen ELMo) and scored_split, with the
machine and the exact settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="directory with train/, dev/, test/ in the seq.in layout")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time limit (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--score", choices=["test", "dev"], default="test",
                        help="test: train on train + dev, score test (once); dev: train on train, score dev")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override of the training config (repeatable)")
    args = parser.parse_args(argv)

    import torch
    from omegaconf import OmegaConf

    from transformer_lab.data.atis import prepare_atis, read_seq_in_dir
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.evaluation.atis import score_predictions
    from transformer_lab.runtime.config import compose_config
    from transformer_lab.training.train import train
    from transformer_lab.utils.io import atomic_write_json

    with tempfile.TemporaryDirectory(prefix="atis-bench-") as tmp:
        try:
            splits = read_seq_in_dir(args.data)
            summary = prepare_atis(splits, Path(tmp, "prepared"))
        except TransformerLabError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        seconds = int(args.minutes * 60)
        max_time = f"00:{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"  # DD:HH:MM:SS
        overrides = [
            "experiment=atis/full", "logger=none", f"seed={args.seed}",
            f"data.prepared_dir={tmp}/prepared",
            f"data.datamodule.train_splits={'[train,dev]' if args.score == 'test' else '[train]'}",
            f"trainer.max_time='{max_time}'",
            "callbacks.model_checkpoint.monitor=null",  # the last weights, whichever split is scored
            "callbacks.rich_progress_bar=null",
            *args.set,
        ]
        cfg = compose_config("train", overrides, Path(tmp, "run"))
        start = time.perf_counter()
        train(cfg)
        train_seconds = time.perf_counter() - start

        from transformer_lab.tasks.checkpoints import load_task
        from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

        task = load_task(Path(tmp, "run", "checkpoints", "last.ckpt"), JointIntentSlotTask, "train_atis")
        scored = splits[args.score]
        predicted = task.predict([e["words"] for e in scored])
        scores = score_predictions([{**e, "words": [w.lower() for w in e["words"]]} for e in scored], predicted)

    result = {
        **{k: round(v, 4) for k, v in scores.items() if isinstance(v, float)},
        "train_seconds": round(train_seconds, 1),
        "params": sum(p.numel() for p in task.model.parameters()),
        "trainable_params": sum(p.numel() for p in task.model.parameters() if p.requires_grad),
        "scored_split": args.score,
        f"{args.score}_utterances": scores["n_utterances"],
        f"{args.score}_oov_rate": round(summary[args.score]["oov_rate"], 4),
        "data": str(Path(args.data).resolve()),
        "overrides": overrides,
        "model": OmegaConf.to_container(cfg.model),
        "machine": {**machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__},
    }
    atomic_write_json(args.out, result)
    print({k: result[k] for k in ("intent_acc", "slot_f1", "sentence_acc", "token_acc", "non_o_token_acc",
                                   "train_seconds", "params")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
