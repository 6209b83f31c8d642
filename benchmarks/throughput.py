"""Training speed against the machine's own limit: this project's BERT, GPT and ViT beside
Hugging Face `transformers`' model of the same config, on the same batches, as a fraction of
the matmul peak measured on the same machine in the same run.

    python benchmarks/throughput.py --out FILE.json [--models bert,gpt,vit] [--sizes tiny,mini]
                                    [--steps 10] [--warmup 2] [--repeat 3] [--batch-size 32]
                                    [--seq-len 128] [--device auto] [--precision fp32|bf16] [--compile]
                                    [--profile] [--loss project|torch|both]
                                    [--last-layer chosen|full|both]

Peak: the FLOP/s of a large `torch.mm` (2·n³ per product; n = 2048 on a CPU, 8192 on a GPU) in
fp32, and in bf16 where the device supports it (on a CPU: where bf16 is not slower than fp32),
on the threads the benchmark uses (2 on a CPU, the count the tests and benchmarks here use), the
median of five timed products after warm-up (fewer where one product takes over two seconds).

Models: BERT (`BertForPreTraining` against ours, same weights, MLM + NSP loss), GPT
(`GPT2LMHeadModel` against ours, same weights, next-token loss), both built and timed as in
`benchmarks/hf_parity.py` (which also checks their outputs are equal); the ViT against
`ViTForImageClassification` of the same shape (not the same weights: there is no converter,
and speed does not depend on the values), cross-entropy over 10 classes. BERT and GPT sizes
are the project's named sizes (`tiny` is the CPU default of the pipeline's stages, `mini` the
next); the ViT's `tiny` is the digits model (8 x 8 pictures, 2 x 2 patches: 17 tokens) and
`mini` stands for `vit-ti/16` on 64 x 64 pictures (17 tokens of width 192).

Each model is timed in training steps (forward, loss, backward, fused AdamW step, zero_grad), ours
and the reference taking turns step by step so that load on a shared machine falls on both;
tokens/s (images/s x tokens per image for the ViT) are medians over `--repeat` repeats. FLOPs
per token are the throughput callback's (6N for the parameter matmuls + 12·L·d·T for
attention; for BERT the vocabulary projection counts only at the positions it scores), so `{model}_{size}_mfu_{device}` = FLOPs per token x tokens/s / the measured peak
of the precision trained in (fp32 on a CPU by default; `--precision bf16` autocasts).
`--compile` times ours through `torch.compile` (what `compile.enabled=true` does in training)
against `transformers`' model as it ships, eager. Ours' BERT MLM and GPT next-token losses are
the training tasks' own (`tasks/losses.py`: the same value as `F.cross_entropy` with a cheaper
backward), `transformers`' are `F.cross_entropy` as its models compute them; `--loss torch`
gives ours `F.cross_entropy` too, and `--loss both` times a second copy of ours with it in the
same turns, writing what the cheaper loss alone is worth (`{m}_{s}_project_loss_speedup`).
Ours' BERT computes its last layer only at the MLM-chosen positions and [CLS], the rows the loss
reads (the same loss and gradients; `mlm_positions=`), where `transformers`' computes every
position; `--last-layer full` gives ours the full last layer too, and `--last-layer both` times
a second copy of ours with it in the same turns (`bert_{s}_chosen_rows_speedup`). FLOPs per token
(`{m}_{s}_flops_per_token`) count the full last layer, as `transformers` computes it; ours'
(`bert_{s}_ours_flops_per_token`, its TFLOP/s and MFU) leave out what it skips.

Writes: `peak_fp32_tflops`, `peak_bf16_tflops` (null where unsupported), and per model and size
`{m}_{s}_ours_tokens_per_s`, `{m}_{s}_hf_tokens_per_s`, `{m}_{s}_ours_to_hf_speed`,
`{m}_{s}_flops_per_token`, `{m}_{s}_ours_tflops`, `{m}_{s}_mfu_{cpu|cuda}`,
`{m}_{s}_hf_mfu_{cpu|cuda}`, `{m}_{s}_minor_page_faults` and `{m}_{s}_system_cpu_s` (the kernel's
page faults and CPU seconds over the whole measurement, both models, warm-up included; the
benchmark keeps freed memory for reuse as training does, `utils/memory.py`, unless
`TRANSFORMER_LAB_KEEP_FREED_MEMORY=0`: `keep_freed_memory` says which), with the machine and settings.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

THREADS = 2
VIT_SHAPES = {"tiny": ("tiny", 8, 1), "mini": ("vit-ti/16", 64, 3)}  # our size, picture side, channels


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device, dtype, budget_s: float = 10.0) -> float | None:
    """FLOP/s of a large square matmul in dtype on device, or None where the dtype is unsupported
    or, on a CPU, slower than fp32. At most five timed products, fewer where one takes over a
    fifth of `budget_s`: a slow machine gets a coarser figure rather than a stalled benchmark."""
    import torch

    n = 8192 if device.type == "cuda" else 2048
    if device.type == "cpu" and dtype != torch.float32 and slower_than_fp32(dtype):
        return None
    if device.type == "cpu" and dtype == torch.bfloat16 and not torch.backends.mkldnn.is_available():
        return None
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        times = [timed_product(a, b, device) for _ in range(2)][1:]  # the first pays for allocation
    except RuntimeError:
        return None
    repeats = max(1, min(5, int(budget_s / times[0])))
    times += [timed_product(a, b, device) for _ in range(repeats - 1)]
    return 2 * n**3 / statistics.median(times)


def timed_product(a, b, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    a @ b
    synchronize(device)
    return time.perf_counter() - start


def slower_than_fp32(dtype, n: int = 512) -> bool:
    """Whether this CPU multiplies dtype more slowly than fp32, as it does where dtype is only
    emulated in software: autocast could only slow training there, and timing its peak could
    take many minutes. The gap grows with size (an AVX2-only EPYC: 38x at 256², 47x at 512²,
    540x at 2048²), so any product slower than fp32 counts, not only a large gap."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = {}
    for kind in (torch.float32, dtype):
        x, y = a.to(kind), b.to(kind)
        x @ y
        times = []
        for _ in range(3):  # the fastest of three: a moment of load on a shared machine is not slowness
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        seconds[kind] = min(times)
    return seconds[dtype] > 1.5 * seconds[torch.float32]


def bert_pair(size: str, device):
    import hf_parity

    config = hf_parity.reference_config(size, hf_parity.DROPOUT)
    initial = hf_parity.hf_class("bert")(config).state_dict()
    ours, theirs = hf_parity.paired_models(config, initial, "bert")
    return ours, theirs, hf_parity.ours_bert_loss, hf_parity.hf_bert_loss, ours.config


def gpt_pair(size: str, device):
    import hf_parity

    config = hf_parity.reference_gpt_config(size, hf_parity.DROPOUT)
    initial = hf_parity.hf_class("gpt")(config).state_dict()
    ours, theirs = hf_parity.paired_models(config, initial, "gpt")
    return ours, theirs, hf_parity.ours_gpt_loss, hf_parity.hf_gpt_loss, ours.config


def vit_pair(size: str, device):
    import torch.nn.functional as F
    from transformers import ViTConfig as HFViTConfig
    from transformers import ViTForImageClassification

    from transformer_lab.models.vit import SIZES, VisionTransformer, ViTConfig

    name, side, channels = VIT_SHAPES[size]
    ours = VisionTransformer(ViTConfig(size=name, image_size=side, in_channels=channels, n_classes=10, dropout=0.1))
    layers, hidden, heads, patch = SIZES[name]
    theirs = ViTForImageClassification(HFViTConfig(
        image_size=side, patch_size=patch, num_channels=channels, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, num_labels=10, layer_norm_eps=1e-6))
    ours_loss = lambda model, batch: F.cross_entropy(model(batch["images"]).logits, batch["labels"])  # noqa: E731
    hf_loss = lambda model, batch: F.cross_entropy(model(pixel_values=batch["images"]).logits,  # noqa: E731
                                                    batch["labels"])
    return ours, theirs, ours_loss, hf_loss, ours.config


PAIRS = {"bert": bert_pair, "gpt": gpt_pair, "vit": vit_pair}  # ours and the reference, built alike


def batches_for(kind: str, size: str, args, generator) -> tuple[list[dict], int]:
    """Four batches and the tokens one training step processes."""
    import hf_parity
    import torch

    if kind == "bert":
        return [hf_parity.random_batch(generator, args.batch_size, args.seq_len, padded=False)
                for _ in range(4)], args.batch_size * args.seq_len
    if kind == "gpt":
        return [hf_parity.random_gpt_batch(generator, args.batch_size, args.seq_len)
                for _ in range(4)], args.batch_size * args.seq_len
    name, side, channels = VIT_SHAPES[size]
    from transformer_lab.models.vit import SIZES

    tokens = (side // SIZES[name][3]) ** 2 + 1
    return [{"images": torch.randn(args.batch_size, channels, side, side, generator=generator),
             "labels": torch.randint(0, 10, (args.batch_size,), generator=generator)}
            for _ in range(4)], args.batch_size * tokens


# ours / each copy of ours timed beside it, written as {model}_{size}_<key>
COPY_SPEEDUP_KEYS = {"ours_torch_loss": "project_loss_speedup", "ours_full_last_layer": "chosen_rows_speedup"}


def torch_loss_for(kind: str, args):
    """Ours' loss through F.cross_entropy where `--loss torch|both` asks for it and the model has one to swap."""
    import hf_parity

    return hf_parity.OURS_WITH_TORCH_LOSS.get(kind) if args.loss in ("torch", "both") else None


def ours_runner(kind: str, args, ours_loss):
    """Ours' training loss as `--loss torch` and `--last-layer full` ask (else the tasks' own)."""
    import hf_parity

    torch_loss = torch_loss_for(kind, args)
    if torch_loss and args.loss == "torch":
        return torch_loss
    if kind == "bert" and args.last_layer == "full":
        return hf_parity.ours_bert_full_last_layer_loss
    return ours_loss


def last_layer_flops_skipped(model, batches: list[dict], context: int) -> int:
    """Training FLOPs per token that ours' BERT leaves out by computing its last layer only at the
    chosen positions and [CLS]: that layer's query, output and feed-forward products and its
    attention at the other rows (its keys and values are still computed at every position). Rows
    are padded per batch to the row with most chosen positions, as the model pads them."""
    last = model.bert.blocks[-1]
    per_row = sum(p.numel() for module in (last.attn.q, last.attn.out, last.mlp.fc_in, last.mlp.fc_out)
                  for p in module.parameters())
    rows = statistics.mean((1 + int(b["chosen"].sum(dim=1).max())) / context for b in batches)
    return round((1 - rows) * (6 * per_row + 12 * model.config.d_model * context))


def significant(value: float, digits: int = 6) -> float:
    """`value` to `digits` significant digits: on a slow or busy CPU the peak is a few GFLOP/s and a
    tiny model's MFU a few millionths, where a fixed number of decimals would lose percents."""
    return float(f"{value:.{digits}g}")


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


def measure(kind: str, size: str, args, device, peak: float) -> dict:
    import hf_parity
    import torch

    from transformer_lab.training.callbacks import flops_per_token, matmul_parameters

    generator = torch.Generator().manual_seed(args.seed)
    batches, tokens_per_step = batches_for(kind, size, args, generator)
    batches = [to_device(b, device) for b in batches]
    # copies of ours (the same weights, in the same turns) each with another runner: what one change alone is worth
    copies = {}
    torch_loss = torch_loss_for(kind, args)
    if torch_loss and args.loss == "both":
        copies["ours_torch_loss"] = torch_loss
    if kind == "bert" and args.last_layer == "both":
        copies["ours_full_last_layer"] = hf_parity.ours_bert_full_last_layer_loss
    speeds = {"ours": [], "hf": [], **{name: [] for name in copies}}
    for repeat in range(args.repeat):
        torch.manual_seed(args.seed + repeat)
        ours, theirs, ours_loss, hf_loss, config = PAIRS[kind](size, device)
        runners = {"ours": ours_runner(kind, args, ours_loss), "hf": hf_loss}
        models = {"ours": ours.to(device).train(), "hf": theirs.to(device).train()}
        for name, runner in copies.items():
            models[name], runners[name] = copy.deepcopy(models["ours"]), runner
        if args.compile:  # as `compile.enabled=true` trains: inductor kernels for ours; transformers' model eager
            models = {name: torch.compile(m) if name != "hf" else m for name, m in models.items()}
        seconds = hf_parity.step_seconds(models, runners, batches, args.warmup, args.steps,
                                         bf16=args.precision == "bf16")
        for name in speeds:
            speeds[name].append(tokens_per_step * args.steps / sum(seconds[name]))
        print(f"{kind} {size} repeat {repeat + 1}: " + ", ".join(f"{name} {values[-1]:,.0f}" for name, values in
                                                                 speeds.items()) + " tokens/s", flush=True)
    context = tokens_per_step // args.batch_size
    per_token = flops_per_token(matmul_parameters(ours), config.n_layers, config.d_model, context)
    if kind == "bert":  # the vocabulary projection runs only at the ~15% chosen positions, not at every token
        chosen = statistics.mean(float(b["chosen"].float().mean()) for b in batches)
        per_token -= round(6 * config.vocab_size * config.d_model * (1 - chosen))
    ours_per_token = per_token  # the FLOPs ours executes
    if kind == "bert" and args.last_layer != "full":  # ours' last layer at the chosen rows only
        ours_per_token -= last_layer_flops_skipped(ours, batches, context)
    ours_speed, hf_speed = statistics.median(speeds["ours"]), statistics.median(speeds["hf"])
    prefix = f"{kind}_{size}"
    return {
        f"{prefix}_ours_tokens_per_s": round(ours_speed),
        f"{prefix}_hf_tokens_per_s": round(hf_speed),
        f"{prefix}_ours_to_hf_speed": round(statistics.median(o / h for o, h in zip(speeds["ours"], speeds["hf"])), 3),
        f"{prefix}_flops_per_token": per_token,
        **({f"{prefix}_ours_flops_per_token": ours_per_token} if ours_per_token != per_token else {}),
        f"{prefix}_ours_tflops": significant(ours_per_token * ours_speed / 1e12),
        f"{prefix}_mfu_{device.type}": significant(ours_per_token * ours_speed / peak),
        f"{prefix}_hf_mfu_{device.type}": significant(per_token * hf_speed / peak),
        f"{prefix}_all_speeds": {name: [round(s) for s in values] for name, values in speeds.items()},
        **{f"{prefix}_{COPY_SPEEDUP_KEYS[name]}": round(statistics.median(
            o / c for o, c in zip(speeds["ours"], speeds[name])), 3) for name in copies},
    }


# Where a training step's time goes, by the name of the aten operator that spends it (first match wins).
OP_GROUPS = (("matmul", ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm")),
             ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention")),
             ("softmax / log-softmax", ("softmax", "log_softmax", "nll_loss", "cross_entropy")),
             ("layer norm", ("layer_norm",)), ("gelu", ("gelu",)), ("dropout", ("dropout", "bernoulli", "random")),
             ("optimizer", ("foreach", "adamw", "lerp", "addcdiv", "addcmul", "sqrt")),
             ("embedding", ("embedding",)),
             ("elementwise / copies", ("add", "mul", "div", "copy_", "clone", "fill_", "zero_", "where", "masked",
                                       "contiguous", "transpose", "view", "reshape", "permute", "cat", "sum",
                                       "mean", "tanh", "threshold", "index", "gather", "scatter", "to", "empty")))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), empty elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str | None:
    """The CPU's model name (Linux), None elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def op_group(name: str) -> str:
    op = name.removeprefix("aten::").lower().lstrip("_").removeprefix("native_")  # _softmax, native_layer_norm
    for group, fragments in OP_GROUPS:
        if any(op.startswith(f) for f in fragments):
            return group
    return "other"


def profile_ours(kind: str, size: str, args, device, out: Path) -> dict:
    """torch.profiler over a few training steps of ours: each operator group's share of the step,
    and the full table of the 30 most expensive operators next to the JSON."""
    import hf_parity
    import torch
    from torch.profiler import ProfilerActivity, profile

    batches, _ = batches_for(kind, size, args, torch.Generator().manual_seed(args.seed))
    batches = [to_device(b, device) for b in batches]
    ours, _, ours_loss, _, _ = PAIRS[kind](size, device)
    ours_loss = ours_runner(kind, args, ours_loss)  # --loss/--last-layer both: profile ours' own
    model = ours.to(device).train()
    hf_parity.step_seconds({"ours": model}, {"ours": ours_loss}, batches, args.warmup, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        hf_parity.step_seconds({"ours": model}, {"ours": ours_loss}, batches, 0, args.steps)
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    shares: dict[str, float] = {}
    for event in averages:  # self time: each microsecond counted once, in the operator that spent it
        if event.key.startswith("aten::"):
            group = op_group(event.key)
            shares[group] = shares.get(group, 0.0) + event.self_cpu_time_total / 1e6
    ops_seconds = sum(shares.values())
    shares["python and dispatch (outside aten operators)"] = max(wall - ops_seconds, 0.0)
    table = averages.table(sort_by="self_cpu_time_total", row_limit=30)
    out.with_suffix(f".{kind}_{size}_profile.txt").write_text(table)
    # significant digits, not decimals: one tiny step's optimizer share can be a few ten-thousandths
    return {f"{kind}_{size}_profile_share": {g: significant(t / wall, 3) for g, t in
                                              sorted(shares.items(), key=lambda kv: -kv[1])}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--models", default="bert,gpt,vit", help="comma-separated: bert, gpt, vit")
    parser.add_argument("--sizes", default="tiny,mini",
                        help="comma-separated named sizes, each run for every model (tiny, mini; GPT also gpt2-small)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per model per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps before them")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128, help="BERT and GPT context")
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: autocast, scored against the bf16 peak")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile ours (inductor; compilation falls in the untimed warm-up steps)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile ours (torch.profiler, --steps steps): each operator group's share of "
                             "a step in the JSON, the top operators in OUT.<model>_<size>_profile.txt")
    parser.add_argument("--loss", choices=["project", "torch", "both"], default="project",
                        help="ours' BERT MLM and GPT next-token loss: the project's cheaper-backward cross-entropy "
                             "(tasks/losses.py, as training uses), F.cross_entropy (as transformers'), or both: "
                             "a second copy of ours with F.cross_entropy takes turns too "
                             "({m}_{s}_project_loss_speedup)")
    parser.add_argument("--last-layer", choices=["chosen", "full", "both"], default="chosen",
                        help="ours' BERT last layer: at the MLM-chosen positions and [CLS] only (as training "
                             "runs; the same loss and gradients), at every position (as transformers'), or both: "
                             "a second copy of ours with the full last layer takes turns too "
                             "(bert_{s}_chosen_rows_speedup)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformer_lab.models import bert, gpt
    from transformer_lab.utils.memory import keep_freed_memory

    models = [m for m in args.models.split(",") if m]
    sizes = [s for s in args.sizes.split(",") if s]
    known = {"bert": set(bert.SIZES), "gpt": {n for n, shape in gpt.SIZES.items() if shape[3]}, "vit": set(VIT_SHAPES)}
    unknown = [f"{m} {s}" for m in models for s in sizes if s not in known.get(m, ())]
    if unknown:
        parser.error(f"unknown model or size: {', '.join(unknown)} (BERT: {', '.join(sorted(known['bert']))}; "
                     f"GPT, pre-norm: {', '.join(sorted(known['gpt']))}; ViT: tiny, mini)")

    import torch

    torch.set_num_threads(THREADS)
    freed_memory_kept = keep_freed_memory()  # as the pipelines train (utils/memory.py); both models alike
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    peaks = {"fp32": matmul_peak(device, torch.float32), "bf16": matmul_peak(device, torch.bfloat16)}
    bf16 = "unsupported" if peaks["bf16"] is None else f"{peaks['bf16'] / 1e12:.3f} TFLOP/s"
    print(f"{device.type} matmul peak: fp32 {peaks['fp32'] / 1e12:.3f} TFLOP/s, bf16 {bf16}", flush=True)
    peak = peaks[args.precision]
    if peak is None:
        parser.error(f"--precision {args.precision}: this device has no {args.precision} matmul "
                     "(none, or slower than fp32: emulated in software)")

    import transformers

    result = {"keep_freed_memory": freed_memory_kept, "peak_fp32_tflops": significant(peaks["fp32"] / 1e12),
              "peak_bf16_tflops": None if peaks["bf16"] is None else significant(peaks["bf16"] / 1e12)}
    for kind in models:
        for size in sizes:
            before = resource.getrusage(resource.RUSAGE_SELF)
            result.update(measure(kind, size, args, device, peak))
            after = resource.getrusage(resource.RUSAGE_SELF)
            # the kernel's share: fresh pages faulted in (utils/memory.py keeps freed ones for reuse)
            result[f"{kind}_{size}_minor_page_faults"] = after.ru_minflt - before.ru_minflt
            result[f"{kind}_{size}_system_cpu_s"] = round(after.ru_stime - before.ru_stime, 2)
            if args.profile:
                result.update(profile_ours(kind, size, args, device, Path(args.out)))
    result["machine"] = {**machine(), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                         or platform.machine(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                         "cpu_model": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                         "amx_bf16": "amx_bf16" in cpu_flags(),  # the tile unit that makes bf16 matmuls fast
                         "torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()}
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("all_speeds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
