"""Where a training step's time goes, sampled from outside the process: py-spy reads the training
thread's stack, C and C++ frames included (`--native`), `--rate` times a second while ours and
`transformers`' model each train as in `throughput.py` (same models, batches, loss and fused AdamW).

    python benchmarks/sampled_profile.py --out FILE.json [--models bert,gpt] [--sizes tiny,mini]
                                         [--steps 40] [--warmup 2] [--rate 20] [--which ours,hf]
                                         [--keep-stacks]

Why beside `throughput.py --profile`: torch.profiler times each operator from its entry to its
exit, so it cannot tell an operator's own work from the main thread waiting, at the operator's
end, for the other thread to finish its part (OpenMP's barrier), and every event it records
costs time of its own. A sampler only pauses the process to read its stack, so an operator's
share is the share of samples that land in it, and the waits show as waits.

Each sample is classed by its innermost frame (`GROUPS`: MKL's sgemm, the OpenMP barrier,
softmax, GPT's GELU tanh, layer norm, dropout draws, elementwise loops, the C library's memcpy
and allocator, Python and torch's bindings, the garbage collector, the rest of torch's C++); the
barrier's samples are also split by the operator that waited (`{m}_{s}_{who}_openmp_wait_by_op`).
The child imports and warms up unsampled, then py-spy attaches; only samples inside the timed
steps count. The main thread is sampled: it does its own share of every parallel operator, so
its stack says which operator runs.

Needs py-spy (in the `dev` extra) and leave to trace a process (ptrace: the child names any
tracer allowed, for Yama's ptrace_scope 1); where that is forbidden, the run stops with
py-spy's message. Writes per model, size and side (`ours`, `hf`): `{m}_{s}_{who}_samples`,
`{m}_{s}_{who}_step_s` (the mean step, py-spy's pauses included), `{m}_{s}_{who}_share`
({group: share of the samples}) and `{m}_{s}_{who}_openmp_wait_by_op`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import throughput  # the steps are throughput.py's, built by its helpers, on its threads

TIMED_FRAME = "timed_steps ("  # the child's function around the timed steps: only samples under it count

C_LIBRARY_GROUP = "C library (memcpy, memset, malloc)"
# (group, fragments of the innermost frame's function name), first match wins
GROUPS = (
    ("matmuls (MKL sgemm)", ("sgemm", "gemm_", "mkl_blas")),
    ("softmax", ("softmax",)),
    ("tanh (GPT's GELU)", ("tanh", "gelu")),
    ("layer norm", ("layernorm", "rowwisemoments")),
    ("dropout draws", ("random", "generatorimpl", "mt19937")),
    ("AdamW", ("adam",)),
    ("Python garbage collector", ("gc_collect",)),
    ("elementwise loops and reductions", ("function_ref", "tensoriterator", "vectorized", "vec::", "cpu_kernel",
                                          "basic_loop", "for_each", "reduce", "_sum", "copy", "index", "cat_", "fill",
                                          "sleef_exp")),
    (C_LIBRARY_GROUP, ("memcpy", "memset", "memmove", "malloc", "free", "_int_")),
)
WAIT_GROUP = "OpenMP: waiting for the other thread"
PYTHON_GROUP = "Python and torch's Python bindings"
OTHER_GROUP = "other C++ (the dispatcher, autograd nodes, tensor bookkeeping)"


def frame_function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def frame_library(frame: str) -> str:
    """'name (libfoo.so)' -> 'libfoo.so'; 'name (file.py:12)' -> 'file.py:12'; '' when unnamed."""
    return frame.rsplit(" (", 1)[1].rstrip(")") if " (" in frame else ""


def group_of(frame: str) -> str | None:
    """The first group whose fragments the frame's function name contains, or None."""
    name = frame_function(frame).lower()
    return next((group for group, fragments in GROUPS if any(fragment in name for fragment in fragments)), None)


def waiting_op(frames: list[str]) -> str:
    """The operator whose parallel region the main thread waits in: the first frame above the
    libgomp ones, named by group where one matches."""
    for frame in reversed(frames):
        if "libgomp" in frame_library(frame) or frame_function(frame).startswith("0x"):
            continue
        return group_of(frame) or frame_function(frame)[:80]
    return "unknown"


def classify(frames: list[str]) -> str:
    """The group of one sample, from its innermost frames (outermost first, as py-spy writes them)."""
    leaf = frames[-1]
    parent = frames[-2] if len(frames) > 1 else ""
    if "libgomp" in frame_library(leaf) or (frame_function(leaf).startswith("0x") and "libgomp" in parent):
        return WAIT_GROUP
    group = group_of(leaf)
    if group:
        return group
    library = frame_library(leaf)
    if ".py:" in library or "python" in library or not library:  # libtorch_python.so: the bindings
        return PYTHON_GROUP
    if "libc.so" in library:
        return C_LIBRARY_GROUP
    return OTHER_GROUP


def summarize(raw_lines, timed_frame: str = TIMED_FRAME) -> dict:
    """Shares by group of py-spy's raw (collapsed-stack) lines, 'frame;frame;... count', counting
    only stacks that pass through `timed_frame`."""
    groups: Counter = Counter()
    waits: Counter = Counter()
    for line in raw_lines:
        line = line.rstrip("\n")
        if not line or timed_frame not in line:
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        group = classify(frames)
        groups[group] += int(count)
        if group == WAIT_GROUP:
            waits[waiting_op(frames)] += int(count)
    total = sum(groups.values())
    if not total:
        raise ValueError("no sample fell inside the timed steps (too few steps, or a --rate too low?)")
    return {"samples": total,
            "share": {group: round(n / total, 4) for group, n in groups.most_common()},
            "openmp_wait_by_op": {op: round(n / total, 4) for op, n in waits.most_common()}}


def allow_tracing() -> None:
    """Let py-spy, a sibling rather than a parent, attach: under Yama's ptrace_scope 1 (Ubuntu's
    default) only a process's ancestors may trace it unless it names a tracer (PR_SET_PTRACER)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
    except (OSError, AttributeError):
        pass  # not Linux, or no prctl: attaching may still work (root, ptrace_scope 0)


def child(kind: str, size: str, who: str, args, result_path: Path) -> None:
    """Train one side's model as throughput.py does: warm up, say "ready", wait for the parent's
    "go" (py-spy attached), then time the steps and write the mean step to result_path."""
    import hf_parity
    import torch

    from transformer_lab.utils.memory import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(throughput.THREADS)
    device = torch.device("cpu")
    args.loss, args.last_layer = "project", "chosen"  # each side's own loss, as throughput.py times them
    batches, _ = throughput.batches_for(kind, size, args, torch.Generator().manual_seed(args.seed))
    ours, theirs, ours_loss, theirs_loss, _ = throughput.PAIRS[kind](size, device)
    model, loss = (ours, throughput.ours_runner(kind, args, ours_loss)) if who == "ours" else (theirs, theirs_loss)
    model.train()
    hf_parity.step_seconds({who: model}, {who: loss}, batches, args.warmup, 1)

    def timed_steps() -> float:
        start = time.perf_counter()
        hf_parity.step_seconds({who: model}, {who: loss}, batches, 0, args.steps)
        return (time.perf_counter() - start) / args.steps

    allow_tracing()
    print("ready", flush=True)
    sys.stdin.readline()
    result_path.write_text(json.dumps({"step_s": timed_steps()}))


def last_line(path: Path) -> str:
    """A log's last line, for a one-line error."""
    return (path.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]


def wait_for_line(path: Path, text: str, process, timeout_s: float) -> bool:
    """Whether `text` appeared in the file `path` before `process` exited or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return path.exists() and text in path.read_text(errors="replace")


def sample(kind: str, size: str, who: str, args, py_spy: str, out: Path) -> dict:
    """Start the child, let it import and warm up unsampled (py-spy's native unwinding is slowest
    while libraries load), attach py-spy to it, then let the timed steps run."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        raw, result, spy_log, child_log = (scratch / name for name in ("stacks.txt", "step.json", "spy.log",
                                                                       "child.log"))
        command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, size, who, "--child-result",
                   str(result), "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size",
                   str(args.batch_size), "--seq-len", str(args.seq_len), "--seed", str(args.seed)]
        with open(child_log, "w") as child_err, open(spy_log, "w") as spy_out:
            trainee = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=child_err,
                                       text=True)
            spy = None
            try:
                if trainee.stdout.readline().strip() != "ready":
                    trainee.wait()
                    raise SystemExit(f"{kind} {size} {who} failed before its timed steps: "
                                     f"{last_line(child_log)}")
                spy = subprocess.Popen([py_spy, "record", "--pid", str(trainee.pid), "--native", "--rate",
                                        str(args.rate), "--format", "raw", "--output", str(raw)],
                                       stdout=spy_out, stderr=subprocess.STDOUT)
                if not wait_for_line(spy_log, "Sampling process", spy, timeout_s=60):
                    raise SystemExit(f"py-spy could not attach to {kind} {size} {who}: {last_line(spy_log)}")
                trainee.stdin.write("go\n")
                trainee.stdin.close()
                trainee.wait()
                spy.wait(timeout=120)
            finally:
                for process in (trainee, spy):
                    if process is not None and process.poll() is None:
                        process.kill()
        if trainee.returncode != 0 or not result.exists():
            raise SystemExit(f"{kind} {size} {who} failed in its timed steps (exit {trainee.returncode}): "
                             f"{last_line(child_log)}")
        if not raw.exists():
            raise SystemExit(f"py-spy wrote no stacks for {kind} {size} {who}: "
                             f"{last_line(spy_log)}")
        summary = summarize(raw.read_text().splitlines())
        summary["step_s"] = round(json.loads(result.read_text())["step_s"], 4)
        if args.keep_stacks:
            shutil.copyfile(raw, out.with_suffix(f".{kind}_{size}_{who}_stacks.txt"))
    top = ", ".join(f"{group} {share:.1%}" for group, share in list(summary["share"].items())[:4])
    print(f"{kind} {size} {who}: {summary['samples']} samples, {summary['step_s']:.3f} s a step; {top}", flush=True)
    return {f"{kind}_{size}_{who}_{key}": value for key, value in summary.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--models", default="bert,gpt", help="comma-separated: bert, gpt, vit")
    parser.add_argument("--sizes", default="tiny,mini", help="comma-separated sizes, as throughput.py's")
    parser.add_argument("--which", default="ours,hf", help="comma-separated: ours, hf (transformers)")
    parser.add_argument("--steps", type=int, default=40, help="timed training steps, sampled")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first, not sampled")
    parser.add_argument("--rate", type=int, default=20,
                        help="samples a second; each pauses the process, so a higher rate slows the steps it samples "
                             "(compare {m}_{s}_{who}_step_s with throughput.py's tokens/s)")
    parser.add_argument("--keep-stacks", action="store_true",
                        help="also write py-spy's stacks next to the JSON (OUT.<model>_<size>_<who>_stacks.txt), "
                             "for a flame graph or a closer look")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "SIZE", "WHO"), help=argparse.SUPPRESS)
    parser.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, args, args.child_result)
        return 0
    if not args.out:
        parser.error("--out is required")
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        raise SystemExit("py-spy not found: pip install py-spy (it is in the project's dev extra)")

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    for kind in args.models.split(","):
        for size in args.sizes.split(","):
            for who in args.which.split(","):
                result.update(sample(kind, size, who, args, py_spy, Path(args.out)))
    result["settings"] = {"models": args.models, "sizes": args.sizes, "which": args.which, "steps": args.steps,
                          "warmup": args.warmup, "rate": args.rate, "batch_size": args.batch_size,
                          "seq_len": args.seq_len, "seed": args.seed, "threads": throughput.THREADS,
                          "cpu": throughput.cpu_model(),
                          "py_spy": subprocess.run([py_spy, "--version"], check=True, capture_output=True,
                                                   text=True).stdout.strip()}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
