"""Generation from an intermediate layer, its text metrics, the lens table and the ``generate``/``lens`` commands.

Tiny GPT-2, LLaMA and Qwen2 models are built offline from configs. GPT-2 is initialised with a large std (0.5):
with the default 0.02 its tied embeddings make the random model repeat one token from every layer, and tests
comparing token sequences would pass trivially.
"""

import json
import math
from fractions import Fraction

import lightning
import lightning.pytorch as pl
import pytest
import torch
from tiny_models import tiny_config
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    BertModel,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from layerwise.cli import main as cli_main
from layerwise.commands.decoding import generate_from_layer
from layerwise.commands.lens import lens_markdown, lens_table, write_lens
from layerwise.datamodules.tokenizers import byte_tokenizer
from layerwise.features.hooks import block_output
from layerwise.features.paths import HeadSteps, get_blocks, layer_paths
from layerwise.features.sentence_encoder import SentenceEncoder
from layerwise.features.truncate import truncated
from layerwise.metrics.generation import coherence, corpus_rep_n, diversity, rep_n

hf_logging.set_verbosity_error()

DEPTH, WIDTH, VOCAB = 4, 32, 257  # 257: the byte tokenizer's 256 bytes + <|endoftext|>


def gpt2_config() -> PretrainedConfig:
    return tiny_config(
        "gpt2",
        n_layer=DEPTH,
        n_embd=WIDTH,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=64,
        initializer_range=0.5,
        bos_token_id=256,
        eos_token_id=256,
    )


def build(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    decoder = dict(
        num_hidden_layers=DEPTH,
        hidden_size=WIDTH,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.3,  # with 0.02 attention is nearly uniform and wrong positions go unnoticed
    )
    configs = {
        "gpt2": gpt2_config,
        "llama": lambda: tiny_config("llama", **decoder),
        "qwen2": lambda: tiny_config("qwen2", **decoder),
    }
    config = configs[kind]()
    model = AutoModelForCausalLM.from_config(config).eval()
    blocks = get_blocks(model, layer_paths(model))
    assert len(blocks) == DEPTH and model.config.vocab_size == VOCAB and model.config.hidden_size == WIDTH
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request: pytest.FixtureRequest) -> nn.Module:
    return build(request.param)


@pytest.fixture(scope="module")
def gpt2() -> nn.Module:
    return build("gpt2")


def prompt_ids(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def parts(model: nn.Module) -> tuple[nn.ModuleList, HeadSteps]:
    paths = layer_paths(model)
    return get_blocks(model, paths), HeadSteps(model, paths.shared_head)


# --- truncated forward ---------------------------------------------------------------------------------------------


def test_truncated_forward_equals_shared_head_of_block_output(model: nn.Module) -> None:
    blocks, head = parts(model)
    ids = prompt_ids()
    outputs: dict[int, torch.Tensor] = {}
    handles = [
        block.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, block_output(out)))
        for i, block in enumerate(blocks)
    ]
    with torch.no_grad():
        full = model(ids).logits
        for handle in handles:
            handle.remove()
        for layer in range(1, DEPTH + 1):
            with truncated(model, layer):
                assert len(parts(model)[0]) == layer and model.config.num_hidden_layers == layer
                logits = model(ids).logits
            torch.testing.assert_close(logits, head(outputs[layer - 1]), atol=1e-5, rtol=0)
        different = [not torch.allclose(head(outputs[i]), full, atol=1e-3) for i in range(DEPTH - 1)]
    assert all(different), "shallow layers must predict differently from the full model, else the test is vacuous"
    torch.testing.assert_close(model(ids).logits, full)


@pytest.mark.parametrize("kind", ["gpt2", "qwen2"])
def test_truncated_restores_the_model_after_an_error(kind: str) -> None:
    model = build(kind)
    blocks, _ = parts(model)
    layer_types = list(getattr(model.config, "layer_types", None) or [])
    ids = prompt_ids()
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(RuntimeError, match="boom"), truncated(model, 2):
        if layer_types:
            assert len(model.config.layer_types) == 2
        raise RuntimeError("boom")
    assert parts(model)[0] is blocks and len(blocks) == DEPTH and model.config.num_hidden_layers == DEPTH
    assert list(getattr(model.config, "layer_types", None) or []) == layer_types
    if kind == "gpt2":
        assert model.config.n_layer == DEPTH
    else:
        assert len(layer_types) == DEPTH
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before)


@pytest.mark.parametrize("layer", [0, DEPTH + 1, -1])
def test_layer_out_of_range_names_the_flag(gpt2: nn.Module, layer: int) -> None:
    with pytest.raises(ValueError, match="--layer"):
        generate_from_layer(gpt2, prompt_ids(), layer, 3)
    assert len(parts(gpt2)[0]) == DEPTH


# --- generation ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [1, 3])
def test_generation_from_layer_l_runs_exactly_l_blocks_and_the_head_once_per_step(model: nn.Module, layer: int) -> None:
    blocks, head = parts(model)
    calls = [0] * (DEPTH + len(head.modules()))
    watched = [*blocks, *head.modules()]
    handles = [
        module.register_forward_hook(lambda m, a, out, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, module in enumerate(watched)
    ]
    try:
        steps = 3
        generated = generate_from_layer(model, prompt_ids(), layer, steps)
    finally:
        for handle in handles:
            handle.remove()
    assert generated.shape == (2, steps)
    assert calls[:DEPTH] == [steps] * layer + [0] * (DEPTH - layer)
    assert calls[DEPTH:] == [steps] * len(head.modules())  # final norm and LM head, once per step


def test_greedy_with_cache_equals_without_cache(model: nn.Module) -> None:
    ids = prompt_ids()
    sequences = []
    for layer in (1, DEPTH - 1):
        cached = generate_from_layer(model, ids, layer, 6, use_cache=True)
        uncached = generate_from_layer(model, ids, layer, 6, use_cache=False)
        torch.testing.assert_close(cached, uncached, rtol=0, atol=0)
        sequences.append(cached)
    assert not torch.equal(*sequences), "the two layers must not generate the same text"
    assert any(len(set(s[0].tolist())) > 2 for s in sequences), "a model repeating one token makes this vacuous"


def test_left_padded_prompt_generates_like_the_unpadded_prompt(model: nn.Module) -> None:
    ids = prompt_ids(batch=2, length=7)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    padded = generate_from_layer(model, ids, 2, 6, attention_mask=mask)
    alone = generate_from_layer(model, ids[:1, 3:], 2, 6)
    torch.testing.assert_close(padded[:1], alone, rtol=0, atol=0)


def test_generation_stops_at_eos_and_pads_finished_rows_with_it(gpt2: nn.Module) -> None:
    ids = prompt_ids()
    free = generate_from_layer(gpt2, ids, DEPTH, 5)
    eos = int(free[0, 2])
    stopped = generate_from_layer(gpt2, ids, DEPTH, 5, eos_token_id=eos)
    first = int((stopped[0] == eos).nonzero()[0])
    assert first <= 2 and (stopped[0, first:] == eos).all()
    torch.testing.assert_close(stopped[0, : first + 1], free[0, : first + 1])


def test_sampling_is_reproducible_with_a_seed(gpt2: nn.Module) -> None:
    ids = prompt_ids()
    greedy = generate_from_layer(gpt2, ids, 2, 8)
    for strategy in ("top_k", "nucleus"):
        runs = [
            generate_from_layer(
                gpt2,
                ids,
                2,
                8,
                strategy=strategy,
                top_k=20,
                top_p=0.95,
                temperature=2.0,
                seed=seed,
            )
            for seed in (7, 7, 8)
        ]
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
        assert not torch.equal(runs[0], runs[2]), f"{strategy}: another seed must give another sample"
        assert not torch.equal(runs[0], greedy), f"{strategy} at temperature 2 must not be greedy"


@torch.no_grad()
def reference_greedy(model: nn.Module, ids: torch.Tensor, layer: int, steps: int) -> torch.Tensor:
    """The previous implementation's greedy rule, written independently of truncation and of `generate`: re-run the
    full model on the whole sequence, read block `layer`'s output at the last position with a hook, apply the shared
    head, take the argmax."""
    blocks, head = parts(model)
    sequence = ids
    captured = {}
    for _ in range(steps):
        handle = blocks[layer - 1].register_forward_hook(lambda m, a, out: captured.__setitem__("h", block_output(out)))
        try:
            model(sequence, use_cache=False)
        finally:
            handle.remove()
        token = head(captured["h"][:, -1]).argmax(dim=-1)
        sequence = torch.cat([sequence, token[:, None]], dim=1)
    return sequence[:, ids.shape[1] :]


@pytest.mark.parametrize("layer", [1, 2, DEPTH])
def test_greedy_generate_equals_the_previous_greedy_rule(model: nn.Module, layer: int) -> None:
    ids = prompt_ids()
    expected = reference_greedy(model, ids, layer, 6)
    torch.testing.assert_close(generate_from_layer(model, ids, layer, 6), expected, rtol=0, atol=0)
    assert len(set(expected[0].tolist())) > 1, "a model repeating one token makes this vacuous"


def test_sampling_with_one_candidate_is_greedy(gpt2: nn.Module) -> None:
    ids = prompt_ids()
    greedy = generate_from_layer(gpt2, ids, 2, 8)
    top_1 = generate_from_layer(gpt2, ids, 2, 8, strategy="top_k", top_k=1, temperature=3.0, seed=1)
    tiny_nucleus = generate_from_layer(gpt2, ids, 2, 8, strategy="nucleus", top_p=1e-6, temperature=3.0, seed=1)
    torch.testing.assert_close(top_1, greedy, rtol=0, atol=0)
    torch.testing.assert_close(tiny_nucleus, greedy, rtol=0, atol=0)


def test_beam_search_runs_only_the_first_l_blocks(gpt2: nn.Module) -> None:
    blocks, _ = parts(gpt2)
    calls = [0] * DEPTH
    handles = [
        block.register_forward_hook(lambda m, a, out, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, block in enumerate(blocks)
    ]
    try:
        beams = generate_from_layer(gpt2, prompt_ids(), 2, 5, strategy="beam", num_beams=3)
    finally:
        for handle in handles:
            handle.remove()
    assert beams.shape == (2, 5)
    assert calls[0] > 0 and calls[1] > 0 and calls[2:] == [0] * (DEPTH - 2)
    single = generate_from_layer(gpt2, prompt_ids(), 2, 5, strategy="beam", num_beams=1)
    torch.testing.assert_close(single, generate_from_layer(gpt2, prompt_ids(), 2, 5), rtol=0, atol=0)


def test_stop_strings_end_the_generation(gpt2: nn.Module) -> None:
    tokenizer = byte_tokenizer()
    ids = prompt_ids(batch=1)
    free = generate_from_layer(gpt2, ids, DEPTH, 8)[0].tolist()
    stop = tokenizer.decode(free[2:3])
    assert stop.strip() and stop not in tokenizer.decode(free[:2]), "pick a token whose text appears first at 3"
    stopped = generate_from_layer(gpt2, ids, DEPTH, 8, stop_strings=[stop], tokenizer=tokenizer)[0].tolist()
    assert stopped == free[:3]
    with pytest.raises(ValueError, match="stop_strings"):
        generate_from_layer(gpt2, ids, DEPTH, 8, stop_strings=[stop])


# --- metrics -------------------------------------------------------------------------------------------------------


def test_rep_n_and_diversity_by_hand() -> None:
    tokens = "the cat the cat the cat".split()
    # 2-grams: 5, unique {the cat, cat the}; 3-grams: 4, unique 2; 4-grams: 3, unique 2
    rep2, rep3, rep4 = 1 - Fraction(2, 5), 1 - Fraction(2, 4), 1 - Fraction(2, 3)
    assert rep_n(tokens, 2) == pytest.approx(float(rep2))
    assert rep_n(tokens, 3) == pytest.approx(float(rep3))
    assert rep_n(tokens, 4) == pytest.approx(float(rep4))
    assert diversity(["the cat the cat the cat"]) == pytest.approx(float((1 - rep2) * (1 - rep3) * (1 - rep4)))
    assert diversity([tokens]) == diversity(["  the cat\nthe cat the   cat "])  # whitespace tokens
    assert rep_n(["one"], 2) == 0.0 and diversity(["one"]) == 1.0 and diversity(["a b c d e"]) == 1.0
    with pytest.raises(TypeError):
        diversity("the cat the cat")


def test_corpus_rep_n_sums_per_text_counts() -> None:
    texts = ["a b a b", "a b"]  # 2-grams: (ab, ba, ab) -> 2 unique of 3; (ab) -> 1 unique of 1
    assert corpus_rep_n(texts, 2) == pytest.approx(1 - 3 / 4)  # pooled set: 1 - 2/4; mean of ratios: 1/6
    assert corpus_rep_n(["x", "y"], 2) == 0.0


def bag_of_letters(texts: list[str]) -> torch.Tensor:
    return torch.tensor([[text.count(chr(ord("a") + i)) for i in range(26)] for text in texts], dtype=torch.float)


def test_coherence_with_a_toy_encoder_by_hand() -> None:
    # cos(ab, ab) = 1; cos(abc, cd) = 1 / (sqrt(3) sqrt(2))
    value = coherence(["ab", "abc"], ["ab", "cd"], bag_of_letters)
    assert value == pytest.approx((1 + 1 / math.sqrt(6)) / 2)
    with pytest.raises(ValueError, match="as many continuations"):
        coherence(["ab"], ["ab", "cd"], bag_of_letters)


def tiny_bert_folder(tmp_path) -> str:
    corpus = ["the cat sat on the mat", "a dog ran in the park", "cats and dogs play", "the sun is warm"] * 5
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    backend.train_from_iterator(
        corpus, trainers.WordPieceTrainer(vocab_size=80, special_tokens=specials, show_progress=False)
    )
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )
    torch.manual_seed(0)
    config = tiny_config(
        "bert",
        vocab_size=backend.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    folder = str(tmp_path / "bert")
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_sentence_encoder_on_a_tiny_bert(tmp_path) -> None:
    folder = tiny_bert_folder(tmp_path)
    texts = ["the cat sat", "a dog ran in the warm park and the sun"]
    reference = BertModel.from_pretrained(folder).eval()
    batch = PreTrainedTokenizerFast.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = reference(**batch)
    cls = SentenceEncoder(folder)
    embeddings = cls(texts)
    assert embeddings.shape == (2, 16)
    torch.testing.assert_close(embeddings, out.pooler_output)
    torch.testing.assert_close(SentenceEncoder(folder, pooling="cls_before_pooler")(texts), out.last_hidden_state[:, 0])
    torch.testing.assert_close(cls(texts[:1]), embeddings[:1], atol=1e-5, rtol=0)  # padding does not leak in
    assert not torch.allclose(embeddings[0], embeddings[1])
    assert -1 <= coherence(texts, texts[::-1], cls) < 1
    with pytest.raises(ValueError, match="name_or_path"):
        SentenceEncoder(str(tmp_path / "missing"))


# --- lens ----------------------------------------------------------------------------------------------------------


def test_lens_table_last_row_is_the_full_model_and_each_row_its_truncated_model(gpt2: nn.Module, tmp_path) -> None:
    tokenizer = byte_tokenizer()
    prompt = "Hello, lens"
    table = lens_table(gpt2, tokenizer, prompt, 5)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    generated = generate_from_layer(gpt2, ids, DEPTH, 5, eos_token_id=tokenizer.eos_token_id)[0]
    positions = len(generated)
    assert positions >= 3 and table.generated_ids == generated.tolist()
    assert table.layers == list(range(1, DEPTH + 1))
    assert table.token_ids.shape == table.probs.shape == (DEPTH, positions)
    assert len(table.tokens) == DEPTH and all(len(row) == positions for row in table.tokens)
    sequence = torch.cat([ids[0], generated[:-1]])[None]
    start = ids.size(1) - 1
    with torch.no_grad():
        for layer in range(1, DEPTH + 1):
            with truncated(gpt2, layer):
                probs = gpt2(sequence).logits[0, start:].softmax(-1)
            torch.testing.assert_close(table.probs[layer - 1], probs.max(-1).values, atol=1e-5, rtol=0)
            assert table.token_ids[layer - 1].tolist() == probs.argmax(-1).tolist()
    assert table.token_ids[-1].tolist() == generated.tolist()
    assert table.tokens[-1] == table.generated_tokens
    chosen = lens_table(gpt2, tokenizer, prompt, 5, layers=[0, -1])
    assert chosen.layers == [1, DEPTH]
    torch.testing.assert_close(chosen.probs, table.probs[[0, -1]])

    markdown = lens_markdown(table)
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + DEPTH and rows[-1].startswith(f"| {DEPTH} |")
    assert all(row.count(" | ") == positions for row in rows)
    paths = write_lens(table, tmp_path / "lens")
    assert [p.name for p in paths] == ["lens.md", "lens.png"] and paths[1].stat().st_size > 1000


# --- command line --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory, gpt2: nn.Module) -> str:
    folder = str(tmp_path_factory.mktemp("gpt2"))
    gpt2.save_pretrained(folder)
    return folder


def test_cli_generate_from_several_layers_writes_json(model_folder: str, gpt2: nn.Module, tmp_path, capsys) -> None:
    out = tmp_path / "generate.json"
    argv = ["generate", "--model", model_folder, "--tokenizer", "byte", "--prompt", "Once upon"]
    cli_main([*argv, "--layers", "1", str(DEPTH), "--max_new_tokens", "5", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["prompt"] == "Once upon" and record["num_layers"] == DEPTH
    ids = byte_tokenizer()("Once upon", return_tensors="pt")["input_ids"]
    for result, layer in zip(record["results"], [1, DEPTH]):
        expected = generate_from_layer(gpt2, ids, layer, 5, eos_token_id=256)[0].tolist()
        assert result["layer"] == layer and result["token_ids"] == expected
    assert f"--- layer {DEPTH}/{DEPTH} ---" in capsys.readouterr().out

    sample = [*argv, "--layer", "2", "--strategy", "nucleus", "--top_p", "0.9", "--temperature", "1.5", "--seed", "3"]
    first = out.read_bytes()
    with pytest.raises(SystemExit):  # the first run's file is kept: refused before any model is loaded
        cli_main([*sample, "--max_new_tokens", "5", "--out", str(out)])
    error = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error) == 1 and "--out=" in error[0] and "already exists" in error[0] and "--overwrite true" in error[0]
    assert out.read_bytes() == first
    cli_main([*sample, "--max_new_tokens", "5", "--out", str(out), "--overwrite", "true"])
    expected = generate_from_layer(
        gpt2,
        ids,
        2,
        5,
        strategy="nucleus",
        top_p=0.9,
        temperature=1.5,
        seed=3,
        eos_token_id=256,
    )
    assert json.loads(out.read_text())["results"][0]["token_ids"] == expected[0].tolist()


def test_cli_lens_writes_markdown_and_figure(model_folder: str, tmp_path, capsys) -> None:
    out = tmp_path / "lens"
    cli_main(
        [
            "lens",
            "--model",
            model_folder,
            "--tokenizer",
            "byte",
            "--prompt",
            "Hi",
            "--max_new_tokens",
            "4",
            "--layers",
            "2",
            str(DEPTH),
            "--out",
            str(out),
        ]
    )
    markdown = (out / "lens.md").read_text()
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == 3  # header + layers 2 and 4
    assert (out / "lens.png").stat().st_size > 1000
    assert "lens.png" in capsys.readouterr().out


class TinyCausalLMModule(pl.LightningModule):
    """Stands in for a layerwise module: the checkpoint's Hugging Face model is ``backbone.model``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Module()
        torch.manual_seed(seed)
        self.backbone.model = AutoModelForCausalLM.from_config(gpt2_config())


def test_cli_generate_from_a_checkpoint(tmp_path) -> None:
    module = TinyCausalLMModule(seed=3)
    path = tmp_path / "tiny.ckpt"
    hyper_parameters = {"seed": 3, "_class_path": f"{__name__}.TinyCausalLMModule"}
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": hyper_parameters,
            "pytorch-lightning_version": lightning.__version__,
        },
        path,
    )
    out = tmp_path / "out.json"
    cli_main(
        [
            "generate",
            "--checkpoint",
            str(path),
            "--tokenizer",
            "byte",
            "--prompt",
            "abc",
            "--layer",
            "2",
            "--max_new_tokens",
            "4",
            "--out",
            str(out),
        ]
    )
    ids = byte_tokenizer()("abc", return_tensors="pt")["input_ids"]
    expected = generate_from_layer(module.backbone.model, ids, 2, 4, eos_token_id=256)[0].tolist()
    assert json.loads(out.read_text())["results"][0]["token_ids"] == expected


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--layer", "0"], "--layer"),
        (["--layers", "1", "-2"], "--layers"),
        (["--top_p", "1.5"], "--top_p"),
        (["--top_k", "0"], "--top_k"),
        (["--temperature", "0"], "--temperature"),
        (["--max_new_tokens", "0"], "--max_new_tokens"),
        (["--tokenizer", "bpe:abc"], "--tokenizer"),
        (["--tokenizer", "bpe:512"], "--tokenizer_dir"),
    ],
)
def test_cli_bad_input_names_the_flag_before_loading_the_model(extra, flag, monkeypatch, capsys) -> None:
    def no_loading(*args, **kwargs):
        raise AssertionError("the model must not be loaded for bad input")

    monkeypatch.setattr("layerwise.commands._options.load_causal_lm", no_loading)
    argv = ["generate", "--model", "unused", "--tokenizer", "byte", "--prompt", "x"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*argv, *extra])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_cli_errors_after_loading_name_the_flag(model_folder: str, tmp_path, capsys) -> None:
    for argv, flag in [
        (["generate", "--model", model_folder, "--tokenizer", "byte", "--prompt", "x", "--layer", "9"], "--layer"),
        (["lens", "--model", model_folder, "--tokenizer", "byte", "--prompt", "x", "--layers", "5"], "--layers"),
        (
            ["generate", "--checkpoint", str(tmp_path / "missing.ckpt"), "--tokenizer", "byte", "--prompt", "x"],
            "--checkpoint",
        ),
        (["generate", "--model", str(tmp_path / "missing"), "--tokenizer", "byte", "--prompt", "x"], "--model"),
    ]:
        with pytest.raises(SystemExit):
            cli_main(argv)
        assert flag in capsys.readouterr().err
