"""CLIP (App. D): per-layer features of both towers, COS within and across modalities, the ``layerwise clip``
command on a tiny random CLIP with a real processor and an image folder written here."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer
from transformers.utils import logging as hf_logging

from layerwise.cli import main
from layerwise.commands.clip import CLIPAnalysis
from layerwise.features.clip import clip_layers
from layerwise.metrics import layer_cosine_similarity
from layerwise.metrics.similarity import PairedCosine

hf_logging.set_verbosity_error()


def byte_symbols() -> list[str]:
    """The 256 printable symbols byte-level BPE (GPT-2, CLIP) uses for the bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    extra = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(extra))]


BYTES = byte_symbols()
VOCAB = {token: index for index, token in enumerate(BYTES + [b + "</w>" for b in BYTES])}
VOCAB.update({"<|startoftext|>": len(VOCAB), "<|endoftext|>": len(VOCAB) + 1})


def tiny_clip(eos_token_id: int = len(VOCAB) - 1) -> CLIPModel:
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(VOCAB),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            bos_token_id=len(VOCAB) - 2,
            eos_token_id=eos_token_id,
            pad_token_id=len(VOCAB) - 1,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=16,
            patch_size=4,
        ),
        projection_dim=24,
    )
    return CLIPModel(config).eval()


def hidden_states_reference(model, pixel_values, input_ids, attention_mask, eos):
    """Per-layer [CLS] / [EOS] features from transformers' own ``output_hidden_states`` (an independent path)."""
    with torch.no_grad():
        vision = model.vision_model(pixel_values=pixel_values, output_hidden_states=True).hidden_states[1:]
        text = model.text_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    rows = torch.arange(input_ids.shape[0])
    return torch.stack([h[:, 0] for h in vision]), torch.stack([h[rows, eos] for h in text.hidden_states[1:]])


@pytest.mark.parametrize("legacy_eos", [False, True])
def test_clip_layers_match_hidden_states_and_the_models_own_features(legacy_eos):
    model = tiny_clip(2 if legacy_eos else len(VOCAB) - 1)
    g = torch.Generator().manual_seed(1)
    pixel_values = torch.randn(5, 3, 16, 16, generator=g)
    input_ids = torch.randint(3, len(VOCAB) - 2, (5, 9), generator=g)
    eos = torch.tensor([8, 5, 3, 8, 6])
    input_ids[torch.arange(5), eos] = len(VOCAB) - 1  # the end-of-text token: also the highest id
    attention_mask = (torch.arange(9) <= eos[:, None]).long()
    layers = clip_layers(model, pixel_values, input_ids, attention_mask)
    vision, text = hidden_states_reference(model, pixel_values, input_ids, attention_mask, eos)
    torch.testing.assert_close(layers.vision, vision, rtol=0, atol=1e-6)
    torch.testing.assert_close(layers.text, text, rtol=0, atol=1e-6)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixel_values).pooler_output
        caption = model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
    torch.testing.assert_close(layers.vision_projected[-1], image, rtol=0, atol=1e-6)
    torch.testing.assert_close(layers.text_projected[-1], caption, rtol=0, atol=1e-6)


def test_paired_cosine_matches_a_loop_and_is_exact_over_batches():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(3, 20, 6, generator=g), torch.randn(2, 20, 6, generator=g)
    metric = PairedCosine(3, 2)
    for part_x, part_y in zip(x.split((7, 1, 12), 1), y.split((7, 1, 12), 1)):
        metric.update(part_x, part_y)
    xs, ys = x.double().numpy(), y.double().numpy()
    expected = [
        [
            np.mean([xs[a, i] @ ys[b, i] / np.linalg.norm(xs[a, i]) / np.linalg.norm(ys[b, i]) for i in range(20)])
            for b in range(2)
        ]
        for a in range(3)
    ]
    np.testing.assert_allclose(metric.compute().numpy(), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="paired samples"):
        metric.update(x, y[:, :5])
    with pytest.raises(ValueError, match=r"\(2, B, 6\)"):
        metric.update(x, torch.randn(2, 20, 5))


def write_model_and_images(tmp_path):
    model = tiny_clip()
    folder = tmp_path / "clip"
    model.save_pretrained(folder)
    (tmp_path / "vocab.json").write_text(json.dumps(VOCAB))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(vocab=dict(VOCAB), merges=[])
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = CLIPProcessor(image_processor=images, tokenizer=tokenizer)
    processor.save_pretrained(folder)
    g = np.random.default_rng(0)
    for name in ("cat", "ship"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for index in range(4):
            pixels = g.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{index}.png")
    return model, processor


def test_clip_command_writes_within_and_cross_modality_cos(tmp_path):
    model, processor = write_model_and_images(tmp_path)
    out = tmp_path / "out"
    main(
        [
            "clip",
            "--data",
            str(tmp_path / "images"),
            "--model",
            str(tmp_path / "clip"),
            "--batch_size",
            "3",
            "--out",
            str(out),
        ]
    )
    results = json.loads((out / "clip.json").read_text())
    assert {path.name for path in out.iterdir()} == {"clip.json", "clip_vision.png", "clip_text.png", "clip_cross.png"}
    assert results["num_pairs"] == 8 and results["vision_layers"] == [1, 2, 3] and results["text_layers"] == [1, 2]

    # the same pairs by hand: the model's own features and the single-model COS of the same per-layer features
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(tmp_path / "images"))
    images = [dataset[i][0] for i in range(8)]
    captions = [f"This is a photo of a {dataset.classes[dataset[i][1]]}." for i in range(8)]
    batch = processor(text=captions, images=images, return_tensors="pt", padding=True)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=batch["pixel_values"]).pooler_output
        caption = model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    cross = torch.nn.functional.cosine_similarity(image.double(), caption.pooler_output.double()).mean()
    assert results["cross_cos"][-1][-1] == pytest.approx(float(cross), abs=1e-6)
    eos = batch["input_ids"].eq(len(VOCAB) - 1).int().argmax(-1)
    vision, text = hidden_states_reference(
        model, batch["pixel_values"], batch["input_ids"], batch["attention_mask"], eos
    )
    np.testing.assert_allclose(results["vision_cos"], layer_cosine_similarity(vision).numpy(), atol=1e-6)
    np.testing.assert_allclose(results["text_cos"], layer_cosine_similarity(text).numpy(), atol=1e-6)
    projected = model.visual_projection(model.vision_model.post_layernorm(vision)).detach()
    np.testing.assert_allclose(results["vision_cos_projected"], layer_cosine_similarity(projected).numpy(), atol=1e-6)


def test_clip_analysis_refuses_other_models_and_the_command_bad_data(tmp_path):
    with pytest.raises(ValueError, match="is not a CLIP model"):
        CLIPAnalysis(torch.nn.Linear(2, 2))
    with pytest.raises(SystemExit):
        main(["clip", "--data", str(tmp_path / "nowhere"), "--model", "x"])


def test_clip_command_names_its_own_options_in_one_line(tmp_path, capsys):
    """A missing --model is refused before any data is read, naming --model (not the training CLI's sub-options);
    a folder with no images gets one short line, not torchvision's list of every sub-folder."""
    for name in ["cat", "dog", *(f"class_with_a_long_name_{i}" for i in range(20))]:
        (tmp_path / name).mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["clip", "--data", str(tmp_path), "--model", str(tmp_path / "no_model")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"`--model={tmp_path / 'no_model'}` does not exist" in error and "model_name_or_path" not in error
    with pytest.raises(SystemExit):
        main(["clip", "--data", str(tmp_path), "--model", str(tmp_path)])
    error = capsys.readouterr().err
    assert "no class sub-folder holds an image file" in error and "class_with_a_long_name" not in error


def test_clip_config_parses_with_the_command_parser(tmp_path):
    from pathlib import Path

    from layerwise.cli.parser import command_parser
    from layerwise.commands.clip import clip

    config = Path(__file__).resolve().parents[2] / "configs" / "clip" / "cifar10.yaml"
    parsed = command_parser("clip", clip).parse_args(["--config", str(config), "--data", str(tmp_path)])
    assert parsed.model == "openai/clip-vit-base-patch32" and "{label}" in parsed.template


def test_a_rank_without_pairs_holds_states_of_the_same_shapes_as_one_with_pairs():
    """The all-reduce packs every rank's states into one buffer: a rank that saw no pair must pack the same length."""
    from layerwise.commands.clip import CLIPAnalysis

    model = tiny_clip()
    empty, fed = CLIPAnalysis(model), CLIPAnalysis(model)
    torch.manual_seed(0)
    fed.add(
        {
            "pixel_values": torch.randn(3, 3, 16, 16),
            "input_ids": torch.tensor([[0, 3, 4, len(VOCAB) - 1]] * 3),
            "attention_mask": torch.ones(3, 4, dtype=torch.long),
        }
    )
    for name in fed.metrics:
        shapes = {key: tuple(value.shape) for key, value in fed.metrics[name].metric_state.items()}
        assert {key: tuple(value.shape) for key, value in empty.metrics[name].metric_state.items()} == shapes, name
