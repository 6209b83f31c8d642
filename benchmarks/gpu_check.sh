#!/usr/bin/env bash
# Accelerator check: train GPT `gpt2-small` for a few hundred steps under each multi-device
# strategy (DDP, FSDP, DeepSpeed ZeRO-2) in bf16 on all GPUs of this machine, and write
# tokens/s, MFU and peak memory per strategy to a JSON file. Meant to finish in under 8 minutes.
#
#   benchmarks/gpu_check.sh [OUT.json]          (default benchmarks/results/gpu_check.json)
#
# Every figure is read back from the run's MLflow metrics (the Throughput callback), as the
# median over the logged steps after the first 20% (compilation, allocator warm-up).
# Environment knobs (defaults in brackets): STRATEGIES ["ddp fsdp deepspeed_stage_2"],
# SIZE [gpt2-small], CONTEXT [1024], BATCH [16 per device], STEPS [300], PRECISION [bf16-mixed],
# SECONDS_PER_STRATEGY [140], EXTRA [""]: more Hydra overrides for every run (e.g. compile.enabled=true).
# A CPU rehearsal of the script itself:
#   STRATEGIES=ddp_cpu SIZE=tiny CONTEXT=64 BATCH=8 STEPS=20 PRECISION=32-true benchmarks/gpu_check.sh /tmp/check.json
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-benchmarks/results/gpu_check.json}
STRATEGIES=${STRATEGIES:-"ddp fsdp deepspeed_stage_2"}
SIZE=${SIZE:-gpt2-small}
CONTEXT=${CONTEXT:-1024}
BATCH=${BATCH:-16}
STEPS=${STEPS:-300}
PRECISION=${PRECISION:-bf16-mixed}
SECONDS_PER_STRATEGY=${SECONDS_PER_STRATEGY:-140}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-python}
WORK=outputs/gpu_check
LOG_EVERY=10

mkdir -p "$WORK"
# The training data: the embedded corpus and its tokenizers (skipped when already built).
if [ ! -f data/tokenizers/corpus/bpe/tokenizer.json ]; then
    "$PYTHON" pipelines/prepare.py data=corpus >"$WORK/prepare.log" 2>&1 &&
        "$PYTHON" pipelines/train_tokenizers.py >>"$WORK/prepare.log" 2>&1 ||
        { echo "error: preparing the corpus failed, see $WORK/prepare.log" >&2; exit 1; }
fi

for strategy in $STRATEGIES; do
    rm -rf "${WORK:?}/$strategy"
    if [[ $strategy == deepspeed* ]] && ! "$PYTHON" -c "import deepspeed" 2>/dev/null; then
        echo "skipped: deepspeed is not installed (pip install deepspeed)" >"$WORK/$strategy.status"
        continue
    fi
    echo "== $strategy: $SIZE, context $CONTEXT, batch $BATCH per device, $STEPS steps, $PRECISION"
    # Validation and checkpoints are cut to a minimum: this measures training steps.
    timeout --signal=INT --kill-after=20 "$SECONDS_PER_STRATEGY" \
        "$PYTHON" pipelines/train.py experiment=gpt/pretrain task_name=gpu_check "trainer=$strategy" \
        "model.size=$SIZE" "model.max_len=$CONTEXT" model.dropout=0.0 "trainer.precision=$PRECISION" \
        "data.datamodule.batch_size=$BATCH" data.datamodule.max_eval_blocks=32 \
        trainer.max_epochs=1000 "++trainer.max_steps=$STEPS" ++trainer.limit_val_batches=2 \
        trainer.check_val_every_n_epoch=1000 "trainer.log_every_n_steps=$LOG_EVERY" \
        callbacks.model_checkpoint=null callbacks.rich_progress_bar=null tracking.log_trained_model=false \
        "hydra.run.dir=$WORK/$strategy" $EXTRA >"$WORK/$strategy.log" 2>&1
    status=$?
    if [ $status -eq 0 ]; then
        echo "ok" >"$WORK/$strategy.status"
    else
        echo "failed (exit $status): $(grep -v -e '^\s*$' -e HYDRA_FULL_ERROR "$WORK/$strategy.log" | tail -n 1)" >"$WORK/$strategy.status"
    fi
    cat "$WORK/$strategy.status"
done

"$PYTHON" - "$OUT" "$WORK" "$STRATEGIES" "$SIZE" "$CONTEXT" "$BATCH" "$STEPS" "$PRECISION" <<'EOF'
import json, os, statistics, sys, tempfile
from pathlib import Path

import torch
from mlflow import MlflowClient

out, work, strategies, size, context, batch, steps, precision = sys.argv[1:]
result = {"machine": {"gpus": torch.cuda.device_count(),
                      "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                      "torch": torch.__version__, "cuda": torch.version.cuda},
          "recipe": {"model": size, "context": int(context), "batch_per_device": int(batch), "steps": int(steps),
                     "precision": precision, "extra_overrides": os.environ.get("EXTRA", "")},
          "strategies": {}}
if torch.cuda.is_available():
    # What this GPU really delivers on a large bf16 matmul: MFU against it says how much of the
    # reachable speed the training gets (the table's peak is the datasheet's).
    sys.path.insert(0, "benchmarks")
    from throughput import matmul_peak

    result["machine"]["bf16_matmul_tflops"] = matmul_peak(torch.device("cuda"), torch.bfloat16) / 1e12
for strategy in strategies.split():
    status = Path(work, f"{strategy}.status").read_text().strip()
    entry = {"status": status}
    reference = Path(work, strategy, "mlflow_run.json")
    if reference.is_file():
        run = json.loads(reference.read_text())
        client = MlflowClient(run["tracking_uri"])
        for name in ("tokens_per_s", "mfu", "peak_memory_gib", "flops_per_token"):
            history = sorted(client.get_metric_history(run["run_id"], f"perf/{name}"), key=lambda m: m.step)
            values = [m.value for m in history[len(history) // 5:]]
            entry[name] = statistics.median(values) if values else None
        entry["logged_steps"] = len(client.get_metric_history(run["run_id"], "perf/tokens_per_s"))
        entry["mlflow_run_id"] = run["run_id"]
        measured = result["machine"].get("bf16_matmul_tflops")
        if measured and entry.get("flops_per_token") and entry.get("tokens_per_s"):
            entry["mfu_of_measured_matmul_peak"] = entry["flops_per_token"] * entry["tokens_per_s"] / (measured * 1e12)
    result["strategies"][strategy] = entry
Path(out).parent.mkdir(parents=True, exist_ok=True)
with tempfile.NamedTemporaryFile("w", dir=Path(out).parent, delete=False, suffix=".tmp") as tmp:
    json.dump(result, tmp, indent=2)
os.replace(tmp.name, out)
print(json.dumps(result, indent=2))
EOF
