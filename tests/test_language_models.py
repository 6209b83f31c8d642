"""benchmarks/language_models.py: words counted as the published WikiText figures count them,
every token predicted exactly once by the sliding window, per-word perplexity as exp(total NLL /
words) whatever the tokens, and its JSON contract on a tiny WikiText-layout folder."""

import importlib.util
import json
import math

import pytest
import torch
from conftest import ROOT

spec = importlib.util.spec_from_file_location("language_models_benchmark", ROOT / "benchmarks" / "language_models.py")
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)

TEXT = " = Heading = \n\n the cat sat on the mat . \n the dog sat . \n"  # 4 lines, a blank one among them


def wikitext(folder, text: str = TEXT):
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text(text * 20)
    return folder


def test_every_line_ends_with_one_eos_word_blank_lines_too(tmp_path):
    corpus = benchmark.Corpus(wikitext(tmp_path / "wt"), bpe_vocab=300)
    assert corpus.words["test"] == 20 * (4 + 1 + 8 + 5)  # " = Heading = ", "", "the cat ...", "the dog sat ."
    # every word is predicted: the stream opens with the <eos> of the line before
    assert len(corpus.word_ids["test"]) == corpus.words["test"] + 1
    assert corpus.bpe_ids["test"][0] == corpus.eot and int((corpus.bpe_ids["test"] == corpus.eot).sum()) == 81


class LastTokenOnly(torch.nn.Module):
    """A model whose prediction depends on the current token alone: any window gives it the same
    log-likelihoods, so the sliding window must reproduce one pass over the whole stream."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab_size, vocab_size)

    def forward(self, input_ids):
        return type("Output", (), {"logits": self.table(input_ids)})()


@pytest.mark.parametrize("length", [5, 64, 101])
def test_the_sliding_window_scores_every_token_once(length):
    torch.manual_seed(0)
    stream = torch.randint(0, 11, (length,))
    model = benchmark.LanguageModel("gpt", LastTokenOnly(11), "bpe", context=8, batch_size=3, lr=1e-3,
                                    weight_decay=0.0, train_stream=stream, seed=0, bf16=False)
    with torch.no_grad():
        whole = torch.nn.functional.cross_entropy(model.network(stream[:-1]).logits, stream[1:], reduction="sum")
    assert model.stream_nll(stream, batch_size=2) == pytest.approx(float(whole), rel=1e-5)


def test_per_word_perplexity_is_exp_of_total_nll_over_words():
    # two words, their tokens' NLLs summed: ln 4 + ln 2 + ln 8 over 2 words -> exp(ln 64 / 2) = 8
    assert benchmark.word_ppl(math.log(4) + math.log(2) + math.log(8), 2) == 8.0


def test_a_tiny_run_writes_every_key_and_the_curve(tmp_path):
    out = tmp_path / "lm.json"
    code = benchmark.main(["--data", str(wikitext(tmp_path / "wt")), "--minutes", "0.02", "--out", str(out),
                           "--curve-points", "2", "--slice", "0.3", "--context", "8", "--batch-size", "4",
                           "--bpe-vocab", "300", "--gpt-layers", "1", "--gpt-width", "16", "--gpt-heads", "2",
                           "--elmo-size", "tiny", "--threads", str(torch.get_num_threads()), "--precision", "32"])
    assert code == 0
    result = json.loads(out.read_text())
    for model in ("gpt", "elmo", "lstm"):
        for key in ("val_word_ppl", "test_word_ppl", "params", "tokens_per_s"):
            assert result[f"{model}_{key}"] > 0
        assert len(result[f"{model}_curve"]) == 2
    assert result["minutes"] == 0.02 and out.with_suffix(".png").is_file()


def test_a_missing_split_is_one_line_and_exit_2(tmp_path, capsys):
    folder = wikitext(tmp_path / "wt")
    (folder / "valid.txt").unlink()
    assert benchmark.main(["--data", str(folder), "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {folder / 'valid.txt'}: not found (a WikiText folder holds " \
                                               "train.txt, valid.txt and test.txt)"
