"""benchmarks/sampled_profile.py: py-spy's stacks classed by their innermost frame, only inside the timed
steps; and one real sampled run of a tiny GPT, where py-spy is installed (the dev extra)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def sampled_profile(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("sampled_profile", None)
    import sampled_profile

    return sampled_profile


def test_samples_are_classed_by_their_innermost_frame_and_waits_by_the_operator_that_waited(sampled_profile):
    timed = "<module> (sampled_profile.py:9);timed_steps (sampled_profile.py:120);step_seconds (hf_parity.py:294)"
    lines = [
        f"{timed};at::native::mm (libtorch_cpu.so);mkl_blas_def_sgemm_kernel_0_zen (libtorch_cpu.so) 60",
        f"{timed};mkl_blas_sgemm_omp_driver_v1 (libtorch_cpu.so);0x7f01 (libgomp.so.1);0x7f02 10",
        f"{timed};at::TensorIteratorBase::for_each (libtorch_cpu.so);0x7f01 (libgomp.so.1);0x7f02 5",
        f"{timed};at::native::softmax (libtorch_cpu.so);_vec_softmax_lastdim (libtorch_cpu.so) 10",
        f"{timed};forward (transformer_lab/models/gpt.py:80) 10",
        f"{timed};at::native::empty_strided_cpu (libtorch_cpu.so);c10::allocate_bytes (libtorch_cpu.so) 5",
        "<module> (sampled_profile.py:9);hf_parity.step_seconds (hf_parity.py:294);mkl_blas_def_sgemm (x.so) 99",
        "",
    ]
    summary = sampled_profile.summarize(lines)
    assert summary["samples"] == 100  # the warm-up's 99 samples, outside timed_steps, do not count
    assert summary["share"] == {"matmuls (MKL sgemm)": 0.6, sampled_profile.WAIT_GROUP: 0.15, "softmax": 0.1,
                                sampled_profile.PYTHON_GROUP: 0.1, sampled_profile.OTHER_GROUP: 0.05}
    assert summary["openmp_wait_by_op"] == {"matmuls (MKL sgemm)": 0.1, "elementwise loops and reductions": 0.05}
    with pytest.raises(ValueError, match="no sample"):
        sampled_profile.summarize(lines[-2:])


@pytest.mark.slow  # two processes import torch and transformers under a sampler: 25-45 s
@pytest.mark.skipif(shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("py-spy") is None, reason="py-spy is not installed (pip install -e '.[dev]')")
def test_a_sampled_run_of_ours_and_transformers_gpt_writes_shares_that_add_up(sampled_profile, tmp_path):
    out = tmp_path / "profile.json"
    try:
        assert sampled_profile.main(["--out", str(out), "--models", "gpt", "--sizes", "tiny", "--steps", "3",
                                     "--warmup", "1", "--rate", "50", "--keep-stacks"]) == 0
    except SystemExit as stop:  # a machine that forbids ptrace: nothing here can sample, say so
        if "ermission" in str(stop) or "not permitted" in str(stop):
            pytest.skip(f"this machine forbids tracing a process: {stop}")
        raise
    result = json.loads(out.read_text())
    for who in ("ours", "hf"):
        share = result[f"gpt_tiny_{who}_share"]
        assert result[f"gpt_tiny_{who}_samples"] > 0 and result[f"gpt_tiny_{who}_step_s"] > 0
        assert sum(share.values()) == pytest.approx(1, abs=0.01)
        assert share.get("matmuls (MKL sgemm)", 0) > 0  # a training step multiplies matrices
        assert out.with_suffix(f".gpt_tiny_{who}_stacks.txt").read_text().count("timed_steps (") > 0
    assert result["settings"]["rate"] == 50 and result["settings"]["py_spy"].startswith("py-spy")
