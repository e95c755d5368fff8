"""DETR (App. B.5): aligned auxiliary decoding losses, AP50 per decoder layer, and a COCO-format datamodule, on a
tiny random DETR and a few images with an annotation file written here."""

import json

import numpy as np
import pytest
import torch
from helpers import read_summary, trainer
from PIL import Image
from transformers.utils import logging as hf_logging

from layerwise.callbacks import DetectionLayerAP
from layerwise.datamodules import COCODetectionDataModule
from layerwise.lightning_modules import DetrLayerwise

hf_logging.set_verbosity_error()
TINY = dict(
    backbone_config={
        "model_type": "resnet",
        "embedding_size": 8,
        "hidden_sizes": [8, 16, 16, 32],
        "depths": [1, 1, 1, 1],
        "out_features": ["stage4"],
    },
    d_model=32,
    encoder_layers=1,
    decoder_layers=3,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    num_queries=12,
    num_labels=4,
)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """Nine images of different sizes with 1-3 coloured boxes each and three crowd regions, in the COCO format."""
    root = tmp_path_factory.mktemp("coco")
    (root / "images").mkdir()
    g = np.random.default_rng(0)
    images, annotations = [], []
    for index in range(9):
        height, width = int(g.integers(40, 64)), int(g.integers(40, 64))
        pixels = np.full((height, width, 3), 30, dtype=np.uint8)
        for _ in range(int(g.integers(1, 4))):
            w, h = int(g.integers(8, 20)), int(g.integers(8, 20))
            x, y = int(g.integers(0, width - w)), int(g.integers(0, height - h))
            category = int(g.integers(1, 4))
            pixels[y : y + h, x : x + w] = [80 * category, 255 - 70 * category, 40]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index + 10,
                    "bbox": [x, y, w, h],
                    "category_id": category,
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        if index % 3 == 0:  # a crowd region (COCO's iscrowd): detections there are neither right nor wrong
            w, h = int(g.integers(8, 16)), int(g.integers(8, 16))
            x, y = int(g.integers(0, width - w)), int(g.integers(0, height - h))
            annotation = {"id": len(annotations) + 1, "image_id": index + 10, "bbox": [x, y, w, h], "iscrowd": 1}
            annotations.append({**annotation, "category_id": int(g.integers(1, 4)), "area": w * h})
        Image.fromarray(pixels).save(root / "images" / f"{index:03d}.png")
        images.append({"id": index + 10, "file_name": f"{index:03d}.png", "height": height, "width": width})
    categories = [{"id": i, "name": name} for i, name in ((1, "red"), (2, "green"), (3, "blue"))]
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return root


def datamodule(coco, batch_size=3) -> COCODetectionDataModule:
    return COCODetectionDataModule(
        val_annotations=str(coco / "instances.json"),
        val_images=str(coco / "images"),
        train_annotations=str(coco / "instances.json"),
        train_images=str(coco / "images"),
        processor_size=48,
        batch_size=batch_size,
        num_workers=0,
    )


def first_batch(coco):
    data = datamodule(coco)
    data.setup("validate")
    return next(iter(data.val_dataloader()))


def test_uniform_weights_are_detrs_own_loss_and_linear_weights_weigh_the_same_layer_losses(coco):
    batch = first_batch(coco)
    assert batch["pixel_values"].shape[0] == 3 and len(batch["labels"]) == 3 and "pixel_mask" in batch
    torch.manual_seed(0)
    uniform = DetrLayerwise(config_overrides=TINY, layer_weights="uniform").eval()
    uniform.log = lambda *args, **kwargs: None  # no Trainer: training_step's losses have nowhere to be logged
    loss = uniform.training_step(batch, 0)
    with torch.no_grad():
        own = uniform.model(pixel_values=batch["pixel_values"], pixel_mask=batch["pixel_mask"], labels=batch["labels"])
    torch.testing.assert_close(loss, own.loss, rtol=1e-6, atol=1e-6)  # DETR's auxiliary losses, uniform weights

    aligned = DetrLayerwise(config_overrides=TINY, layer_weights="linear").eval()
    aligned.log = uniform.log
    aligned.load_state_dict(uniform.state_dict())
    logits, boxes = aligned.layer_predictions(batch)
    losses = aligned.layer_losses(logits, boxes, batch["labels"])
    torch.testing.assert_close(aligned.training_step(batch, 0), (torch.tensor([1, 2, 3]) / 2 * losses).sum())
    torch.testing.assert_close(losses.sum(), own.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logits[-1], own.logits, rtol=0, atol=1e-6)  # the last layer is the model's output
    torch.testing.assert_close(boxes[-1], own.pred_boxes, rtol=0, atol=1e-6)


class Oracle(DetrLayerwise):
    """The first queries of every image predict its annotated boxes (crowd regions included) in DETR's convention
    (normalised to the image), with box noise per layer (``noise``: zeros for a perfect detector); the other queries
    are random and mostly "no object". Every prediction is a function of the image alone, never of its batch."""

    def __init__(self, annotations, noise=(0.3, 0.08, 0.0), **kwargs):
        super().__init__(**kwargs)
        record = json.loads(annotations.read_text())
        sizes = {image["id"]: (image["width"], image["height"]) for image in record["images"]}
        self.truth = {image_id: ([], []) for image_id in sizes}
        for annotation in record["annotations"]:
            x, y, w, h = annotation["bbox"]
            width, height = sizes[annotation["image_id"]]
            boxes, labels = self.truth[annotation["image_id"]]
            boxes.append([(x + w / 2) / width, (y + h / 2) / height, w / width, h / height])
            labels.append(annotation["category_id"])
        self.noise = noise

    def layer_predictions(self, batch):
        logits, boxes = super().layer_predictions(batch)
        logits, boxes = logits.clone(), boxes.clone()
        for image, target in enumerate(batch["labels"]):
            g = torch.Generator().manual_seed(int(target["image_id"]))  # the same noise whatever the batching
            true_boxes, true_labels = (torch.tensor(v) for v in self.truth[int(target["image_id"])])
            count = len(true_labels)
            logits[:, image] = torch.randn(logits.shape[0], *logits.shape[2:], generator=g)
            logits[:, image, :, -1] += 3.0  # mostly "no object": low scores
            boxes[:, image] = 0.1 + 0.8 * torch.rand(boxes.shape[0], *boxes.shape[2:], generator=g)
            for layer, noise in enumerate(self.noise):
                jitter = noise * torch.randn(count, 4, generator=g)
                boxes[layer, image, :count] = (true_boxes.float() + jitter).clamp(0.0, 1.0)
                logits[layer, image, :count] = torch.nn.functional.one_hot(true_labels, 5).float() * 8.0
        return logits, boxes


def cocoeval_ap50(coco, module, data) -> list[float]:
    """AP50 of every layer by pycocotools' own COCOeval against the annotation file, from the module's predictions."""
    from contextlib import redirect_stdout
    from io import StringIO

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with redirect_stdout(StringIO()):
        truth = COCO(str(coco / "instances.json"))
    sizes = {image["id"]: (image["width"], image["height"]) for image in truth.dataset["images"]}
    found = [[] for _ in range(module.num_layers)]
    module.eval()
    for batch in data.val_dataloader():
        with torch.no_grad():
            logits, boxes = module.layer_predictions(batch)
        for layer in range(module.num_layers):
            probabilities = logits[layer].double().softmax(-1)[..., :-1].numpy()
            for image, target in enumerate(batch["labels"]):
                image_id = int(target["image_id"])
                width, height = sizes[image_id]
                for query, (cx, cy, w, h) in enumerate(boxes[layer, image].double().numpy()):
                    label = int(probabilities[image, query].argmax())
                    box = [(cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height]
                    score = float(probabilities[image, query, label])
                    found[layer].append({"image_id": image_id, "category_id": label, "bbox": box, "score": score})
    values = []
    for detections in found:
        with redirect_stdout(StringIO()):
            evaluation = COCOeval(truth, truth.loadRes(detections), "bbox")
            evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
        values.append(float(evaluation.stats[1]))  # AP at IoU 0.5, all areas, 100 detections
    return values


@pytest.mark.parametrize("batch_size", [1, 3, 4])
def test_ap50_is_cocoevals_whatever_the_batch_size(coco, tmp_path, batch_size):
    """Mixed image sizes (so padded batches) and crowd regions: a perfect detector scores 1 at every batch size,
    and a noisy one scores what pycocotools' COCOeval gives on the same detections."""
    torch.manual_seed(0)
    data = datamodule(coco, batch_size=batch_size)
    perfect = Oracle(coco / "instances.json", noise=(0.0, 0.0, 0.0), config_overrides=TINY)
    trainer(tmp_path / "perfect", [DetectionLayerAP(log_figures=False)]).validate(perfect, data, verbose=False)
    assert read_summary(tmp_path / "perfect")["detection_ap50"] == pytest.approx([1.0, 1.0, 1.0], abs=1e-9)

    torch.manual_seed(0)
    module = Oracle(coco / "instances.json", config_overrides=TINY)
    trainer(tmp_path / "noisy", [DetectionLayerAP(log_figures=False)]).validate(module, data, verbose=False)
    ap50 = read_summary(tmp_path / "noisy")["detection_ap50"]
    expected = cocoeval_ap50(coco, module, data)
    np.testing.assert_allclose(ap50, expected, rtol=0, atol=1e-6)
    assert expected[0] < expected[1] < expected[2] == pytest.approx(1.0)  # not a comparison of zeros


def test_collated_boxes_are_normalised_to_their_own_image(coco):
    """Whatever the batch (and so the padding), an image's boxes are its annotations over its own size."""
    record = json.loads((coco / "instances.json").read_text())
    sizes = {image["id"]: (image["width"], image["height"]) for image in record["images"]}
    data = datamodule(coco, batch_size=4)
    data.setup("validate")
    batches = list(data.val_dataloader())
    assert [len(batch["labels"]) for batch in batches] == [4, 4, 1]
    for batch in batches:
        for label in batch["labels"]:
            width, height = sizes[int(label["image_id"])]
            kept = [a for a in record["annotations"] if a["image_id"] == label["image_id"] and not a["iscrowd"]]
            expected = [
                [(x + w / 2) / width, (y + h / 2) / height, w / width, h / height]
                for x, y, w, h in (a["bbox"] for a in kept)
            ]
            torch.testing.assert_close(label["boxes"], torch.tensor(expected), rtol=0, atol=1e-5)
            crowd = [a for a in record["annotations"] if a["image_id"] == label["image_id"] and a["iscrowd"]]
            assert int(label["eval_iscrowd"].sum()) == len(crowd)


def test_coco_datamodule_reads_the_annotations_and_refuses_bad_paths(coco, tmp_path):
    data = datamodule(coco, batch_size=9)
    data.setup("fit")
    assert len(data.val_set) == 9 and data.val_set.categories == {1: "red", 2: "green", 3: "blue"}
    image, target = data.val_set[0]
    assert image.mode == "RGB" and target["image_id"] == 10 and target["annotations"]
    batch = next(iter(data.train_dataloader()))
    annotations = json.loads((coco / "instances.json").read_text())["annotations"]
    assert sum(len(t["class_labels"]) for t in batch["labels"]) == sum(not a["iscrowd"] for a in annotations)
    assert sum(len(t["eval_labels"]) for t in batch["labels"]) == len(annotations)  # crowd regions kept for AP
    with pytest.raises(FileNotFoundError, match="--data.init_args.val_annotations"):
        COCODetectionDataModule(val_annotations=str(tmp_path / "x.json"), val_images=str(tmp_path)).setup()
    (tmp_path / "bad.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="lacks \\['annotations', 'categories'\\]"):
        COCODetectionDataModule(val_annotations=str(tmp_path / "bad.json"), val_images=str(tmp_path)).setup()
    with pytest.raises(ValueError, match="`--model.init_args.layer_weights` has 2 entries"):
        DetrLayerwise(config_overrides=TINY, layer_weights=[1.0, 2.0])


@pytest.mark.parametrize("name", ["standard", "aligned"])
def test_detr_configs_train_a_tiny_detr_on_coco_format_files(coco, tmp_path, name):
    from pathlib import Path

    from layerwise.cli import LayerwiseCLI

    config = Path(__file__).resolve().parents[2] / "configs" / "detection" / f"detr_resnet50_coco_{name}.yaml"
    files = [
        f"--data.init_args.{split}_{kind}={coco / ('instances.json' if kind == 'annotations' else 'images')}"
        for split in ("train", "val")
        for kind in ("annotations", "images")
    ]
    cli = LayerwiseCLI(
        args=[
            "fit",
            f"--config={config}",
            "--model.init_args.model_name_or_path=null",
            f"--model.init_args.config_overrides={json.dumps(TINY)}",
            "--data.init_args.processor=null",
            "--data.init_args.processor_size=48",
            "--data.init_args.num_workers=0",
            *files,
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    expected = [1.0, 1.0, 1.0] if name == "standard" else [0.5, 1.0, 1.5]
    assert cli.model.layer_weights.tolist() == pytest.approx(expected)
    summary = json.loads(next(tmp_path.rglob("val_epoch_*.json")).read_text())
    assert len(summary["detection_ap50"]) == 3


def test_ap50_on_two_processes_equals_one(coco, tmp_path, single_thread):
    """9 images on 2 ranks: DistributedSampler repeats one, which the callback drops."""
    torch.manual_seed(0)
    weights = Oracle(coco / "instances.json", config_overrides=TINY).state_dict()
    results = {}
    for devices in (1, 2):
        module = Oracle(coco / "instances.json", config_overrides=TINY)
        module.load_state_dict(weights)
        options = dict(devices=2, strategy="ddp_fork") if devices == 2 else {}
        run = trainer(tmp_path / str(devices), [DetectionLayerAP(log_figures=False)], **options)
        run.validate(module, datamodule=datamodule(coco, batch_size=2), verbose=False)
        results[devices] = read_summary(tmp_path / str(devices))["detection_ap50"]
    np.testing.assert_allclose(results[2], results[1], rtol=0, atol=1e-9)
