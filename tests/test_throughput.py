"""The throughput callback: tokens/s, model FLOPs per token, and MFU only where a peak is known."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel
from transformer_lab.training.callbacks import Throughput, flops_per_token, matmul_parameters


class TinyLanguageModel(L.LightningModule):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.model = GPTLMHeadModel(config)

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["input_ids"][:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), batch["input_ids"][:, 1:].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_gpt_flops_count_and_cpu_run_without_mfu():
    config = GPTConfig(vocab_size=50, size="tiny", max_len=16)
    model = GPTLMHeadModel(config)
    # the tied token table is multiplied by the LM head (counted); the position table is only looked up
    assert matmul_parameters(model) == sum(p.numel() for p in model.parameters()) - model.gpt.position.embedding.weight.numel()
    assert flops_per_token(100, 2, 8, 16) == 600 + 12 * 2 * 8 * 16

    batches = [{"input_ids": torch.randint(0, 50, (4, 17))} for _ in range(4)]
    callback = Throughput(peak_tflops={"H100": 989}, log_every_n_steps=2)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLanguageModel(config), DataLoader(batches, batch_size=None))
    metrics = trainer.callback_metrics
    assert metrics["perf/tokens_per_s"] > 0 and metrics["perf/samples_per_s"] > 0
    expected = flops_per_token(matmul_parameters(model), config.n_layers, config.d_model, 17)  # the batch length
    assert metrics["perf/flops_per_token"] == expected
    assert "perf/mfu" not in metrics  # no peak is known for a CPU


def test_peak_is_looked_up_by_device_name(monkeypatch):
    callback = Throughput(peak_tflops={"H100": 989, "A100": 312})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert callback.device_peak(torch.device("cuda", 0)) == 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 3060")
    assert callback.device_peak(torch.device("cuda", 0)) is None
    assert callback.device_peak(torch.device("cpu")) is None


@pytest.mark.slow  # six models built and stepped: half a minute
def test_the_throughput_benchmark_writes_speeds_and_fractions_of_the_measured_peak(tmp_path):
    """benchmarks/throughput.py, one tiny step per model: the JSON contract, each model's MFU
    computed from its tokens/s, FLOPs per token and the measured peak; unknown sizes refused."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "throughput.json"
    command = [sys.executable, root / "benchmarks" / "throughput.py", "--out", out, "--sizes", "tiny", "--steps", "1",
               "--warmup", "0", "--repeat", "1", "--batch-size", "2", "--seq-len", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    assert scores["peak_fp32_tflops"] > 0
    for model in ("bert", "gpt", "vit"):
        speed = scores[f"{model}_tiny_ours_tokens_per_s"]
        per_token = scores.get(f"{model}_tiny_ours_flops_per_token", scores[f"{model}_tiny_flops_per_token"])
        assert speed > 0 and scores[f"{model}_tiny_hf_tokens_per_s"] > 0 and per_token > 0
        peak = scores["peak_fp32_tflops"] * 1e12  # tokens/s are written whole: half a token/s either way
        assert scores[f"{model}_tiny_mfu_cpu"] == pytest.approx(per_token * speed / peak, rel=0.02,
                                                                abs=per_token * 0.5 / peak)
    # --profile: where ours spends a step, by operator group, shares of the step's wall time
    profiled = subprocess.run([*command, "--models", "gpt", "--profile"], capture_output=True, text=True, timeout=600)
    assert profiled.returncode == 0, profiled.stderr[-2000:]
    shares = json.loads(out.read_text())["gpt_tiny_profile_share"]
    assert shares["matmul"] > 0 and shares["optimizer"] > 0 and 0.9 <= sum(shares.values()) <= 1.1
    assert "aten::" in out.with_suffix(".gpt_tiny_profile.txt").read_text()
    assert scores["keep_freed_memory"] is True and scores["bert_tiny_minor_page_faults"] >= 0
    assert scores["bert_tiny_system_cpu_s"] >= 0
    # --loss both: a copy of ours with F.cross_entropy takes the same turns; the ViT has no such loss to swap;
    # --last-layer both: a copy of ours' BERT with its last layer at every position
    both = subprocess.run([*command, "--models", "bert,gpt,vit", "--loss", "both", "--last-layer", "both"],
                          capture_output=True, text=True, timeout=600)
    assert both.returncode == 0, both.stderr[-2000:]
    scores = json.loads(out.read_text())
    speeds = scores["gpt_tiny_all_speeds"]
    assert scores["gpt_tiny_project_loss_speedup"] == pytest.approx(
        speeds["ours"][0] / speeds["ours_torch_loss"][0], rel=0.01)
    assert "vit_tiny_project_loss_speedup" not in scores and "ours_torch_loss" not in scores["vit_tiny_all_speeds"]
    speeds = scores["bert_tiny_all_speeds"]
    # ours' MFU is from the FLOPs it executes: its last layer only at the chosen rows (checked above)
    assert 0 < scores["bert_tiny_ours_flops_per_token"] < scores["bert_tiny_flops_per_token"]
    assert scores["bert_tiny_chosen_rows_speedup"] == pytest.approx(
        speeds["ours"][0] / speeds["ours_full_last_layer"][0], rel=0.01)
    assert "gpt_tiny_chosen_rows_speedup" not in scores
    refused = subprocess.run([*command[:2], "--out", tmp_path / "x.json", "--models", "vit", "--sizes", "gpt2-small"],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "unknown model or size: vit gpt2-small" in refused.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_cpu_that_only_emulates_bf16_has_no_bf16_peak(monkeypatch):
    """Where bf16 is multiplied in software (an AVX2-only CPU: 540x slower than fp32 on a 2048^2 product), the
    benchmark reports no bf16 peak instead of timing it for twenty minutes; a slow product is timed fewer times."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import throughput

    assert not throughput.slower_than_fp32(torch.float32)  # the same kind against itself: about 1x
    monkeypatch.setattr(throughput, "slower_than_fp32", lambda dtype, n=512: True)
    assert throughput.matmul_peak(torch.device("cpu"), torch.bfloat16) is None

    products = []
    monkeypatch.setattr(throughput, "timed_product", lambda a, b, device: products.append(1) or 4.0)
    assert throughput.matmul_peak(torch.device("cpu"), torch.float32, budget_s=10.0) == 2 * 2048**3 / 4.0
    assert len(products) == 3  # warm-up, then 10 s / 4 s = two timed products, not five
