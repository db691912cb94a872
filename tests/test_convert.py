"""write_dataset: torch, HuggingFace and plain iterables into shards, through the preprocess writer."""

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from ctrl_c_steps import files_of, interrupt_each_step
from PIL import Image

import fastload
from fastload.conversion._write_order import GROUP_BYTES, WRITE_EPOCH, GroupedOrder
from fastload.errors import SchemaMismatchError


def tile(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, size=(3, 16, 16), dtype=np.uint8)


class Tiles(torch.utils.data.Dataset):
    def __init__(self, n: int = 300, fail_at: int | None = None, odd_at: int | None = None) -> None:
        self.n, self.fail_at, self.odd_at = n, fail_at, odd_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise OSError(f"disk gone at {i}")
        image = torch.from_numpy(tile(i))
        if i == self.odd_at:
            image = image[:, :8]
        return image, i % 5


class StreamedTiles(torch.utils.data.IterableDataset):
    def __init__(self, n: int = 300, odd_at: int | None = None, cut_at: int | None = None) -> None:
        self.n, self.odd_at, self.cut_at = n, odd_at, cut_at

    def __iter__(self):
        for i in range(self.n):
            if i == self.cut_at:
                raise OSError("stream cut")
            image = tile(i) if i != self.odd_at else tile(i).astype(np.float32)
            yield {"image": image, "label": np.int64(i % 5), "weight": float(i) / 2}


def shard_bytes(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("*.lmdb"))]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    from fastload.conversion import _convert

    monkeypatch.setattr(_convert, "CHUNK_BYTES", 30 * 3 * 16 * 16)  # about 30 samples per task


def test_map_style_torch_dataset_is_identical_for_any_worker_count(tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        m = fastload.write_dataset(Tiles(), out, codec="zstd", samples_per_shard=64, workers=workers,
                                   names=("image", "label"), progress=False)
        assert m.total == 300 and len(m.shards) == 5
        outs.append(out)
    assert shard_bytes(outs[0]) == shard_bytes(outs[1])
    ds = fastload.ShardDataset(outs[1])
    assert [(f.name, f.dtype, f.shape, f.codec) for f in ds.schema] == [("image", "uint8", (3, 16, 16), "zstd"),
                                                                         ("label", "int64", (), "raw")]
    group = GROUP_BYTES // (3 * 16 * 16 + 8)  # a group's decoded bytes over a sample's
    assert m.extra["order"] == {"kind": "shuffled", "seed": 0, "version": 1, "epoch": WRITE_EPOCH,
                                "group_bytes": GROUP_BYTES, "group_samples": group}
    order = GroupedOrder(0, None, 300, group).samples(0, 300)  # the default order: a sample per source
    assert sorted(order.tolist()) == list(range(300)) and order.tolist() != list(range(300))
    for p in (0, 29, 30, 150, 299):
        i = int(order[p])
        assert np.array_equal(ds[p]["image"].numpy(), tile(i)) and int(ds[p]["label"]) == i % 5


def test_iterable_torch_dataset_with_dict_samples(tmp_path):
    a = fastload.write_dataset(StreamedTiles(), tmp_path / "a", shard_size="50KB", workers=2, progress=False)
    fastload.write_dataset(StreamedTiles(), tmp_path / "b", shard_size="50KB", workers=1, progress=False)
    assert a.total == 300 and len(a.shards) > 3 and shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    ds = fastload.ShardDataset(tmp_path / "a")
    assert ds.schema[2].dtype == "float64" and float(ds[7]["weight"]) == 3.5
    assert np.array_equal(ds[123]["image"].numpy(), tile(123))


def test_huggingface_datasets_map_style_and_iterable(tmp_path):
    hf = datasets.Dataset.from_dict({"image": [tile(i) for i in range(40)], "label": [i % 3 for i in range(40)]})
    m = fastload.write_dataset(hf, tmp_path / "map", samples_per_shard=16, workers=2, progress=False,
                               order="source")
    assert m.total == 40 and [f.name for f in m.fields] == ["image", "label"]
    ds = fastload.ShardDataset(tmp_path / "map")
    assert np.array_equal(ds[33]["image"].numpy(), tile(33)) and int(ds[33]["label"]) == 0
    it = fastload.write_dataset(hf.to_iterable_dataset(), tmp_path / "it", samples_per_shard=16, progress=False)
    assert it.total == 40 and shard_bytes(tmp_path / "it") == shard_bytes(tmp_path / "map")


def test_generator_of_pil_images_and_scalars(tmp_path):
    def samples():
        for i in range(10):
            yield Image.fromarray(tile(i).transpose(1, 2, 0)), i * 1.5

    m = fastload.write_dataset(samples(), tmp_path / "o", samples_per_shard=4, names=["image", "score"],
                               progress=False)
    assert m.total == 10 and m.fields[0].shape == (16, 16, 3)
    ds = fastload.ShardDataset(tmp_path / "o")
    assert np.array_equal(ds[9]["image"].numpy(), tile(9).transpose(1, 2, 0)) and float(ds[9]["score"]) == 13.5


@pytest.mark.parametrize("workers", [1, 2])
def test_schema_mismatch_names_sample_and_field(tmp_path, workers):
    with pytest.raises(SchemaMismatchError, match=r"sample 77 field 'image': shape \(3, 8, 16\), the schema "
                                                  r"\(from sample 0\) has \(3, 16, 16\)"):
        fastload.write_dataset(Tiles(odd_at=77), tmp_path / f"m{workers}", samples_per_shard=50,
                               names=("image", "label"), workers=workers, progress=False)
    with pytest.raises(SchemaMismatchError, match=r"sample 201 field 'image': dtype float32, the schema .* uint8"):
        fastload.write_dataset(StreamedTiles(odd_at=201), tmp_path / f"i{workers}", samples_per_shard=50,
                               workers=workers, progress=False)
    assert not (tmp_path / f"i{workers}" / "manifest.json").exists()


def test_interrupted_write_resumes_to_the_same_bytes(tmp_path):
    reference = tmp_path / "ref"
    fastload.write_dataset(Tiles(), reference, samples_per_shard=40, names=("image", "label"), progress=False)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="disk gone at 250"):
        fastload.write_dataset(Tiles(fail_at=250), out, samples_per_shard=40, names=("image", "label"),
                               workers=2, progress=False)
    journal = json.loads((out / ".progress.json").read_text())
    assert 3 <= len(journal["shards"]) < 8 and not (out / "manifest.json").exists()
    with pytest.raises(ValueError, match=r"samples-per-shard: recorded 40, now 50"):
        fastload.write_dataset(Tiles(), out, samples_per_shard=50, names=("image", "label"), resume=True)
    m = fastload.write_dataset(Tiles(), out, samples_per_shard=40, names=("image", "label"), resume=True,
                               progress=False)
    assert m.total == 300 and shard_bytes(out) == shard_bytes(reference)


def test_iterable_resume_skips_what_is_written(tmp_path):
    reference = tmp_path / "ref"
    fastload.write_dataset(StreamedTiles(), reference, samples_per_shard=64, progress=False)

    with pytest.raises(OSError, match="stream cut"):
        fastload.write_dataset(StreamedTiles(cut_at=200), tmp_path / "o", samples_per_shard=64, progress=False)
    m = fastload.write_dataset(StreamedTiles(), tmp_path / "o", samples_per_shard=64, resume=True, progress=False)
    assert m.total == 300 and shard_bytes(tmp_path / "o") == shard_bytes(reference)


@pytest.mark.slow  # about 90 interrupted writes and their resumes
@pytest.mark.parametrize(("iterable", "again"), [(False, "resume"), (True, "resume"), (False, "overwrite")],
                         ids=["map-style", "iterable", "map-style-overwrite"])
def test_a_ctrl_c_at_every_file_system_step_is_finished_by_resume_or_overwrite(tmp_path, iterable, again):
    # A Ctrl-C between the manifest and the journal's deletion left the journal in the finished dataset;
    # overwrite=True refused what a Ctrl-C before the first journal left ("not a fastload dataset")
    def source():
        return StreamedTiles(n=20) if iterable else [{"image": tile(i), "label": np.int64(i)} for i in range(20)]

    reference = tmp_path / "reference"
    fastload.write_dataset(source(), reference, samples_per_shard=3, progress=False)
    steps = interrupt_each_step(lambda out: fastload.write_dataset(source(), out, samples_per_shard=3, progress=False),
                                lambda out: fastload.write_dataset(source(), out, samples_per_shard=3, progress=False,
                                                                   **{again: True}),
                                tmp_path, files_of(reference))
    assert steps > 30, f"only {steps} file-system steps: the write no longer uses these calls"


def test_write_arrays_interrupted_at_any_step_is_replaced_by_overwrite(tmp_path):
    # write_arrays has no resume: overwrite=True refused its leftovers ("not a fastload dataset")
    arrays = {"image": np.stack([tile(i) for i in range(20)]), "label": np.arange(20, dtype=np.int64)}
    fastload.write_arrays(tmp_path / "reference", arrays, samples_per_shard=3)
    steps = interrupt_each_step(lambda out: fastload.write_arrays(out, arrays, samples_per_shard=3),
                                lambda out: fastload.write_arrays(out, arrays, samples_per_shard=3, overwrite=True),
                                tmp_path, files_of(tmp_path / "reference"))
    assert steps > 10


@pytest.mark.parametrize("writer", ["write_arrays", "write_dataset"])
def test_an_overwrite_refused_for_its_arguments_keeps_the_old_dataset(tmp_path, writer):
    arrays = {"image": np.stack([tile(i) for i in range(6)]), "label": np.arange(6, dtype=np.int64)}
    out = tmp_path / "ds"
    fastload.write_arrays(out, arrays, samples_per_shard=3)
    before = files_of(out)
    with pytest.raises(ValueError, match="unknown codec"):
        if writer == "write_arrays":
            fastload.write_arrays(out, arrays, samples_per_shard=3, codec="zip", overwrite=True)
        else:
            fastload.write_dataset([{"x": np.zeros(3)}], out, samples_per_shard=3, codec="zip", overwrite=True)
    assert files_of(out) == before
    mine = tmp_path / "mine"  # a folder of the user's: never deleted
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "..progress.json.tmp").write_text("{")
    with pytest.raises(FileExistsError, match="not a fastload dataset"):
        fastload.write_arrays(mine, arrays, samples_per_shard=3, overwrite=True)
    with pytest.raises(FileExistsError, match="not a fastload dataset"):
        fastload.write_dataset([{"x": np.zeros(3)}], mine, samples_per_shard=3, overwrite=True, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="dataset is empty"):
        fastload.write_dataset(Tiles(n=0), tmp_path / "e")
    with pytest.raises(ValueError, match="no unit"):
        fastload.write_dataset(Tiles(), tmp_path / "s", shard_size="512")
    with pytest.raises(ValueError, match="level 30 is not valid"):
        fastload.write_dataset(Tiles(), tmp_path / "l", codec="zstd", level=30)
    with pytest.raises(SchemaMismatchError, match="sample 0 field 'name': a str cannot be stored"):
        fastload.write_dataset([{"name": "x"}], tmp_path / "t")
    fastload.write_dataset(Tiles(n=5), tmp_path / "x", names=("image", "label"), progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        fastload.write_dataset(Tiles(n=5), tmp_path / "x", names=("image", "label"))


def photo(i: int, shape=(24, 32, 3)) -> np.ndarray:
    """A smooth image (png and jpeg compress it as they do photographs), height x width x channels."""
    y, x = np.mgrid[: shape[0], : shape[1]]
    base = (x * 5 + y * 3 + i * 7)[..., None] + np.arange(shape[2]) * 40
    return (base % 256).astype(np.uint8)


class Photos(torch.utils.data.Dataset):
    def __init__(self, n: int = 40, chw: bool = False) -> None:
        self.n, self.chw = n, chw

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        image = photo(i)
        return {"image": image.transpose(2, 0, 1).copy() if self.chw else image, "label": i % 3}


def test_write_dataset_png_and_jpeg_with_layout_and_per_field_codecs(tmp_path):
    m = fastload.write_dataset(Photos(), tmp_path / "png", codec={"image": "png"}, layout="hwc",
                               samples_per_shard=16, progress=False, order="source")
    assert [(f.name, f.codec, dict(f.codec_options)) for f in m.fields] == [
        ("image", "png", {"layout": "hwc", "level": 6}), ("label", "raw", {})]
    ds = fastload.ShardDataset(tmp_path / "png")
    assert np.array_equal(ds[5]["image"].numpy(), photo(5)) and int(ds[5]["label"]) == 2
    m = fastload.write_dataset(Photos(chw=True), tmp_path / "png_chw", codec="png", samples_per_shard=16,
                               progress=False)  # a single codec: arrays get it, scalars stay raw; chw guessed
    assert [(f.codec, f.codec_options.get("layout")) for f in m.fields] == [("png", "chw"), ("raw", None)]
    m = fastload.write_dataset(Photos(), tmp_path / "jpeg", codec={"image": "jpeg"}, layout="hwc", quality=95,
                               subsampling="444", progress=False, order="source")
    assert dict(m.fields[0].codec_options) == {"layout": "hwc", "quality": 95, "subsampling": "444"}
    got = fastload.ShardDataset(tmp_path / "jpeg")[3]["image"].numpy().astype(int)
    assert np.abs(got - photo(3)).mean() < 3
    with pytest.raises(ValueError, match=r"codec names field\(s\) \['img'\].*\['image', 'label'\]"):
        fastload.write_dataset(Photos(), tmp_path / "typo", codec={"img": "png"}, progress=False)
    with pytest.raises(ValueError, match=r"unknown codec 'webp' for field 'image'"):
        fastload.write_dataset(Photos(), tmp_path / "webp", codec={"image": "webp"}, progress=False)


@pytest.mark.parametrize("iterable", [False, True])
def test_write_dataset_codec_auto_prints_and_records_its_choice(tmp_path, capsys, iterable):
    source = Photos() if not iterable else (Photos()[i] for i in range(40))
    m = fastload.write_dataset(source, tmp_path / "auto", codec="auto", layout="hwc", prefer="size",
                               samples_per_shard=16, progress=True, order="source")
    out = capsys.readouterr().out
    assert "codec auto (size) for 'image':" in out and "jpeg" not in out  # lossy only with lossy_ok
    choice = m.provenance["codec_choice"]["image"]
    assert choice["chosen"] == m.fields[0].codec != "raw" and choice["prefer"] == "size"
    assert m.fields[1].codec == "raw" and "label" not in m.provenance["codec_choice"]  # scalars stay raw
    assert m.total == 40 and np.array_equal(fastload.ShardDataset(tmp_path / "auto")[39]["image"].numpy(), photo(39))
    m = fastload.write_dataset(Photos(), tmp_path / "lossy", codec={"image": "auto"}, layout="hwc", prefer="size",
                               lossy_ok=True, progress=False)
    assert "jpeg" in [t["codec"] for t in m.provenance["codec_choice"]["image"]["trials"]]


USER_FOLDERS = {  # what a folder of the user's may hold that a looser rule took for a run's (a review)
    "shard-like-file": {"shard-notes.txt": "n"},
    "shard-like-folder": {"shard-backup/thesis.tex": "t"},
    "dot-shard-file": {".shard-keys": "k"},
    "tasks-file": {".tasks": "x"},
    "tasks-with-notes": {".tasks/todo.md": "x"},
    "split-with-nested": {"train/shard-x/deep.txt": "d"},
    "splits-json-and-images": {"splits.json": "{}", "images/a.png": "p"},
    "journal-and-readme": {"val/.progress.json": "{}", "README.md": "r"},
    "manifest-and-page": {"manifest.json": "{}", "index.html": "h"},
    "temp-and-notes": {"..progress.json.tmp": "{", "notes.txt": "n"},
}


@pytest.mark.parametrize("layout", sorted(USER_FOLDERS))
def test_overwrite_and_resume_refuse_a_folder_holding_what_no_run_writes(tmp_path, layout):
    from fastload.preprocess import main as preprocess_main

    folder = tmp_path / "mine"
    for name, text in USER_FOLDERS[layout].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = files_of(folder)
    arrays = {"x": np.zeros((4, 3), np.uint8)}
    with pytest.raises(FileExistsError, match=r"not a fastload dataset \(.* is not a file a run writes\)"):
        fastload.write_arrays(folder, arrays, samples_per_shard=2, overwrite=True)
    with pytest.raises(FileExistsError, match="not a fastload dataset"):
        fastload.write_dataset([{"x": np.zeros(3, np.uint8)}], folder, samples_per_shard=2, overwrite=True,
                               progress=False)
    if layout not in ("splits-json-and-images", "journal-and-readme", "manifest-and-page"):  # these record a run
        with pytest.raises(FileExistsError, match="refusing to resume into it"):
            fastload.write_dataset([{"x": np.zeros(3, np.uint8)}], folder, samples_per_shard=2, resume=True,
                                   progress=False)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.zeros((32, 32), np.uint8))
    assert preprocess_main(["--data-dir", str(data), "--output-dir", str(folder), "--tile-size", "16",
                            "--no-progress", "--overwrite"]) == 2
    assert files_of(folder) == before


def test_links_in_an_output_folder_are_never_taken_for_a_run_s(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    fastload.write_arrays(elsewhere, {"x": np.zeros((4, 3), np.uint8)}, samples_per_shard=2)
    kept = files_of(elsewhere)
    for link in (".tasks", "train", "shard-00000.lmdb"):
        folder = tmp_path / f"with-{link.strip('.')}"
        folder.mkdir()
        (folder / link).symlink_to(elsewhere if link != "shard-00000.lmdb" else elsewhere / link)
        with pytest.raises(FileExistsError, match=f"{link} is not a file a run writes"):
            fastload.write_arrays(folder, {"x": np.zeros((4, 3), np.uint8)}, samples_per_shard=2, overwrite=True)
        assert (folder / link).is_symlink() and files_of(elsewhere) == kept


def test_resume_over_a_damaged_manifest_names_it_and_keeps_the_journal(tmp_path):
    out = tmp_path / "ds"
    source = [{"x": np.full(3, i, np.uint8)} for i in range(6)]
    fastload.write_dataset(source, out, samples_per_shard=2, progress=False)
    (out / ".progress.json").write_text('{"shards": []}')  # a journal a Ctrl-C left beside the manifest
    (out / "manifest.json").write_text("{")
    with pytest.raises(fastload.errors.DatasetError, match="manifest"):
        fastload.write_dataset(source, out, samples_per_shard=2, progress=False, resume=True)
    assert (out / ".progress.json").exists()
