"""The demo's segmentation job: georeferenced scenes and masks, tiles, a few training steps, scenes stitched back.

Scenes are the sample photographs saved as GeoTIFFs (a made-up UTM georeferencing), each with a
mask of 4 classes from its brightness (a corner left unlabelled: 255). ``preprocess_tiles
--targets`` cuts both on one grid; a 1x1-convolution "model" trains a few steps on shuffled,
augmented, rare-class-weighted batches; then ``Mosaic`` stitches its predictions over the
scenes back into GeoTIFFs, and an identity model checks that stitching gives the
scenes back bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image

from .. import ShardLoader
from .. import transforms as T
from ..conversion.preprocess import main as preprocess_main
from ..loading._mask_weights import from_mask_classes
from ..loading._mosaic import Mosaic

CLASSES = 4
IGNORE = 255
_GEOKEYS = (1, 1, 0, 3, 1024, 0, 1, 1, 1025, 0, 1, 1, 3072, 0, 1, 32633)  # projected, pixel is area, EPSG:32633


def write_scenes(photos: Path, root: Path) -> tuple[Path, Path]:
    """Write each photograph under ``photos`` as a GeoTIFF scene and its 4-class mask; return their folders."""
    scenes, masks = root / "scenes", root / "masks"
    scenes.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(sorted(photos.rglob("*.png"))):
        image = np.asarray(Image.open(path).convert("RGB"))
        brightness = image.astype(np.float32).mean(axis=2)
        mask = np.digitize(brightness, np.quantile(brightness, [0.5, 0.8, 0.97])).astype(np.uint8)
        mask[: image.shape[0] // 8, : image.shape[1] // 8] = IGNORE  # an unlabelled corner
        tags = [(33550, "d", 3, (10.0, 10.0, 0.0), True),
                (33922, "d", 6, (0.0, 0.0, 0.0, 500000.0 + 10000 * i, 4600000.0, 0.0), True),
                (34735, "H", len(_GEOKEYS), _GEOKEYS, True)]
        tifffile.imwrite(scenes / f"{path.stem}.tif", image, photometric="rgb", extratags=tags)
        Image.fromarray(mask).save(masks / f"{path.stem}.png")
    return scenes, masks


def run(photos: Path, out: Path) -> bool:
    """Run the segmentation job under ``out``; return whether every check held."""
    scenes, masks = write_scenes(photos, out / "segmentation")
    shards = out / "segmentation-shards"
    step = ["--data-dir", str(scenes), "--targets", f"masks={masks}", "--output-dir", str(shards),
            "--tile-size", "96", "--stride", "80", "--edge", "pad", "--ignore-index", str(IGNORE),
            "--num-classes", str(CLASSES), "--min-labelled", "0.25", "--val-fraction", "0.3", "--codec", "zstd",
            "--workers", "2", "--no-progress"]
    print("preprocess_tiles " + " ".join(step))
    if preprocess_main(step) != 0:
        return False

    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, CLASSES, kernel_size=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    weights = from_mask_classes(str(shards / "train"))
    augment = [T.RandomCrop(80), T.RandomDihedral(), T.ToDtype("float32", scale=1 / 255)]
    loader = ShardLoader(shards / "train", batch_size=16, seed=0, transforms=augment,
                         sample_weights=weights, fields=["image", "masks"])
    losses = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            logits = model(batch["image"])
            loss = torch.nn.functional.cross_entropy(logits, batch["masks"].long(), ignore_index=IGNORE)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    print(f"segmentation: {len(losses)} steps on rare-class-weighted, augmented image+mask batches; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    # Inference covers whole scenes: every tile, none dropped (no --min-labelled), no targets needed.
    val = out / "inference-shards"
    step = ["--data-dir", str(scenes), "--output-dir", str(val), "--tile-size", "96", "--stride", "80",
            "--edge", "pad", "--codec", "zstd", "--no-progress"]
    print("preprocess_tiles " + " ".join(step))
    if preprocess_main(step) != 0:
        return False
    predictions = out / "predictions"
    with torch.no_grad(), Mosaic(val, predictions, channels=CLASSES, blend="gaussian") as mosaic:
        for batch in ShardLoader(val, batch_size=32, shuffle=False):
            probabilities = model(batch["image"].float() / 255).softmax(dim=1)
            mosaic.add(batch, probabilities)
    written = sorted(predictions.glob("*.tif"))
    with tifffile.TiffFile(written[0]) as tif:
        tags = tif.pages.first.tags
        georeferenced = 33922 in tags and 34735 in tags
        shape = tif.series[0].shape
    print(f"stitched predictions: {len(written)} scene(s) in {predictions}, {written[0].name} {shape} float32, "
          f"georeferenced: {georeferenced}")

    identity = out / "stitched-images"
    with Mosaic(val, identity, channels=3, blend="clip") as mosaic:
        for batch in ShardLoader(val, batch_size=32, shuffle=True, seed=1):
            mosaic.add(batch, batch["image"])
    same = all(np.array_equal(tifffile.imread(identity / f"{p.stem}.tif"),
                              tifffile.imread(scenes / f"{p.stem}.tif").transpose(2, 0, 1)) for p in written)
    print(f"scenes stitched back from shuffled tiles bit for bit: {same}")
    return same and georeferenced
