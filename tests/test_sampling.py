"""ShardLoader's sampling modes: subsets, per-sample weights, concatenations and mixtures.

Every mode gets the loader's promises: the same batches for both backends and
any thread count, exact resume and elastic resume (one shared helper per mode),
distributed partitions and ``len()``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BACKENDS, batches_equal, smooth_images

import fastload
from fastload import SchemaMismatchError, ShardDataset, ShardLoader, StateError


def labels(batches) -> list[int]:
    return torch.cat([b["label"] for b in batches]).tolist() if batches else []


def clone(batch):
    return {k: t.clone() for k, t in batch.items()}


@pytest.fixture(scope="module")
def second_dataset(tmp_path_factory) -> Path:
    """40 samples with the small dataset's schema (labels 10000 + i), raw codec: another layout."""
    out = tmp_path_factory.mktemp("second") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(40, (3, 8, 8), seed=1),
                                "label": 10000 + np.arange(40, dtype=np.int64)}, samples_per_shard=15)
    return out


@pytest.fixture(scope="module")
def second_zstd(tmp_path_factory) -> Path:
    """As ``second_dataset`` but with the small dataset's codecs (same record layout)."""
    out = tmp_path_factory.mktemp("second_zstd") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(40, (3, 8, 8), seed=1),
                                "label": 10000 + np.arange(40, dtype=np.int64)}, codec={"image": "zstd"},
                          samples_per_shard=15)
    return out


# ---- what each mode covers --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_subset_in_given_order_or_shuffled_among_themselves(small_dataset, backend):
    chosen = [50, 3, 3, 99, 0, 7]
    loader = ShardLoader(small_dataset, batch_size=4, indices=chosen, backend=backend, num_workers=0)
    assert len(loader) == 2
    assert labels(loader) == [7 * i for i in chosen] == labels(loader)  # every epoch the same
    shuffled = ShardLoader(small_dataset, batch_size=4, indices=np.array(chosen), shuffle=True, seed=3,
                           backend=backend, num_workers=0)
    epochs = [labels(shuffled) for _ in range(4)]
    assert all(sorted(e) == sorted(7 * i for i in chosen) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1
    # the documented definition: indices[order_v1(seed, epoch, len(indices))]
    perm = fastload.EpochOrder(3, 0, len(chosen)).positions(0, len(chosen))
    assert epochs[0] == [7 * chosen[p] for p in perm]


def test_dataset_subset_and_loader_over_it(small_dataset):
    ds = ShardDataset(small_dataset)
    sub = ds.subset(torch.tensor([10, 20, 30, 40]))
    assert len(sub) == 4 and int(sub[1]["label"]) == 140
    assert int(sub.subset([3, 0])[0]["label"]) == 280
    loader = ShardLoader(sub, batch_size=3)
    assert labels(loader) == [70, 140, 210, 280]
    with pytest.raises(ValueError, match="not both"):
        ShardLoader(sub, indices=[1])


@pytest.mark.parametrize(("bad", "error", "match"), [
    ([1, 103], IndexError, r"indices\[1\] = 103 is out of range for 103 samples"),
    ([-1], IndexError, r"indices\[0\] = -1 is out of range"),
    ([0.5, 1], TypeError, "must be integers; got 0.5"),
    ([[1, 2]], ValueError, "one-dimensional"),
    (5, TypeError, "sequence or array of sample indices, not int"),
    ("12", TypeError, "not str"),
])
def test_subset_errors_quote_the_bad_value(small_dataset, bad, error, match):
    with pytest.raises(error, match=match):
        ShardDataset(small_dataset).subset(bad)
    with pytest.raises(error, match=match):
        ShardLoader(small_dataset, indices=bad)


def test_empty_subset_has_no_batches(small_dataset):
    loader = ShardLoader(small_dataset, indices=[], shuffle=True)
    assert len(loader) == 0 and list(loader) == []


def chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Return (chi-square statistic, the 0.999 quantile for its degrees of freedom, Wilson-Hilferty)."""
    n = counts.sum()
    mask = probs > 0
    expected = n * probs[mask]
    stat = float(((counts[mask] - expected) ** 2 / expected).sum())
    k = int(mask.sum()) - 1
    z = 3.090232  # the normal 0.999 quantile
    return stat, k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_weighted_draw_frequencies_match_the_weights(small_dataset, backend):
    rng = np.random.default_rng(0)
    weights = rng.uniform(0, 1, 103) ** 3
    weights[[5, 50]] = 0.0
    loader = ShardLoader(small_dataset, batch_size=1000, sample_weights=weights, num_samples=60_000, seed=1,
                         backend=backend, num_workers=0, fields=["label"])
    drawn = np.array(labels(loader)) // 7
    assert len(drawn) == 60_000
    assert not np.isin(drawn, [5, 50]).any()  # zero weight: never drawn
    stat, limit = chi_square_ok(np.bincount(drawn, minlength=103), weights / weights.sum())
    assert stat < limit, (stat, limit)


def test_weighted_without_replacement_is_distinct_and_favours_heavy_samples(small_dataset):
    weights = np.ones(103)
    weights[:10] = 50.0
    firsts = []
    for epoch in range(40):
        loader = ShardLoader(small_dataset, batch_size=20, sample_weights=weights, num_samples=20,
                             replacement=False, seed=2, fields=["label"])
        loader.set_epoch(epoch)
        drawn = labels(loader)
        assert len(drawn) == len(set(drawn)) == 20
        firsts += drawn
    heavy = np.mean([x // 7 < 10 for x in firsts])
    # P(a draw is heavy) for 20 successive draws without replacement is about 0.46 here; uniform would be 0.1
    assert 0.38 < heavy < 0.55
    full = ShardLoader(small_dataset, batch_size=103, sample_weights=weights, num_samples=103, replacement=False)
    assert sorted(labels(full)) == [7 * i for i in range(103)]


def test_without_replacement_first_draw_frequencies(small_dataset):
    weights = np.arange(1, 104, dtype=np.float64)
    counts = np.zeros(103)
    for epoch in range(3000):
        loader = ShardLoader(small_dataset, sample_weights=weights, num_samples=1, replacement=False, seed=5,
                             backend="torch", num_workers=0, fields=["label"])
        loader.set_epoch(epoch)
        counts[labels(loader)[0] // 7] += 1
    stat, limit = chi_square_ok(counts, weights / weights.sum())
    assert stat < limit, (stat, limit)


def test_class_balanced_weights(tmp_path):
    labels_ = np.array([0] * 90 + [1] * 9 + [2] * 1, dtype=np.int64)
    fastload.write_arrays(tmp_path / "ds", {"label": labels_})
    w = fastload.class_balanced_weights(ShardDataset(tmp_path / "ds"))
    assert np.allclose(w[:90], 1 / 90) and np.allclose(w[90:99], 1 / 9) and w[99] == 1.0
    loader = ShardLoader(tmp_path / "ds", batch_size=500, sample_weights=w, num_samples=30_000, seed=0)
    counts = np.bincount(labels(loader), minlength=3)
    assert np.all(np.abs(counts / 30_000 - 1 / 3) < 0.02), counts
    sub = ShardDataset(tmp_path / "ds").subset([0, 1, 99])
    assert np.allclose(fastload.class_balanced_weights(sub), [0.5, 0.5, 1.0])
    with pytest.raises(ValueError, match="no field 'klass'"):
        fastload.class_balanced_weights(ShardDataset(tmp_path / "ds"), field="klass")


def test_weight_errors(small_dataset):
    with pytest.raises(ValueError, match=r"one weight per sample \(103\)"):
        ShardLoader(small_dataset, sample_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"sample_weights\[3\] is -1.0"):
        ShardLoader(small_dataset, sample_weights=[1.0] * 3 + [-1.0] + [1.0] * 99)
    with pytest.raises(ValueError, match=r"sample_weights\[0\] is nan"):
        ShardLoader(small_dataset, sample_weights=[float("nan")] + [1.0] * 102)
    with pytest.raises(ValueError, match="all zero"):
        ShardLoader(small_dataset, sample_weights=np.zeros(103))
    with pytest.raises(ValueError, match="num_samples=5 without replacement needs"):
        ShardLoader(small_dataset, sample_weights=[1.0] * 4 + [0.0] * 99, num_samples=5, replacement=False)
    with pytest.raises(ValueError, match="leave shuffle=False"):
        ShardLoader(small_dataset, sample_weights=np.ones(103), shuffle=True)
    with pytest.raises(ValueError, match="go with sample_weights"):
        ShardLoader(small_dataset, num_samples=5)
    with pytest.raises(ValueError, match="indices and sample_weights were given"):
        ShardLoader(small_dataset, indices=[1], sample_weights=np.ones(103))
    with pytest.raises(ValueError, match="num_samples must be a non-negative integer, not -1"):
        ShardLoader(small_dataset, sample_weights=np.ones(103), num_samples=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concat_is_one_index_space(small_dataset, second_dataset, second_zstd, backend):
    for second in (second_dataset, second_zstd):  # another codec (a reader per layout), the same codecs
        both = fastload.concat([small_dataset, ShardDataset(second)], with_source=True)
        assert len(both) == 143 and int(both[103]["label"]) == 10000 and int(both[103]["source"]) == 1
        loader = ShardLoader(both, batch_size=16, backend=backend, num_workers=0)
        batches = list(loader)
        assert labels(batches) == [7 * i for i in range(103)] + [10000 + i for i in range(40)]
        assert torch.cat([b["source"] for b in batches]).tolist() == [0] * 103 + [1] * 40
        assert batches[0]["source"].dtype == torch.int64
        shuffled = ShardLoader(both, batch_size=16, shuffle=True, backend=backend, num_workers=0)
        assert sorted(labels(shuffled)) == sorted(labels(batches))


@pytest.mark.parametrize("threads", [1, 3])
def test_native_reads_datasets_of_other_layouts_like_the_torch_backend(small_dataset, second_dataset, tmp_path,
                                                                       threads):
    fastload.write_arrays(tmp_path / "more", {"mask": np.ones((30, 2), np.uint8),
                                              "label": 20000 + np.arange(30, dtype=np.int64)}, samples_per_shard=7)
    for mixed in (fastload.mix([small_dataset, second_dataset], weights=[2, 1], stop="all_exhausted",
                               with_source=True),
                  fastload.mix([small_dataset, tmp_path / "more", second_dataset], weights=[1, 1, 1],
                               fields=["label"], stop=200)):
        runs = []
        for backend in BACKENDS:
            loader = ShardLoader(mixed, batch_size=9, shuffle=True, seed=3, backend=backend, num_threads=threads,
                                 num_workers=0)
            first = [clone(b) for b in loader]
            second = [clone(b) for b in loader]
            assert loader.stats()["batches"] == len(second)
            runs.append(first + second)
        assert batches_equal(runs[0], runs[1])


def test_schema_errors(small_dataset, tmp_path):
    fastload.write_arrays(tmp_path / "other", {"image": np.zeros((5, 3, 8, 8), np.uint16),
                                               "label": np.arange(5, dtype=np.int64)})
    fastload.write_arrays(tmp_path / "labels", {"label": np.arange(5, dtype=np.int64),
                                                "source": np.zeros(5, np.int64)})
    with pytest.raises(SchemaMismatchError, match="dataset 1 .* yields .*uint16.*pass fields="):
        fastload.concat([small_dataset, tmp_path / "other"])
    both = fastload.mix([small_dataset, tmp_path / "other"], weights=[1, 1], fields=["label"])
    assert [f.name for f in both.fields] == ["label"]
    with pytest.raises(SchemaMismatchError, match="adds a field 'source'"):
        fastload.concat([tmp_path / "labels"], with_source=True)
    with pytest.raises(ValueError, match="non-empty list"):
        fastload.concat([])
    with pytest.raises(ValueError, match="2 datasets need as many weights"):
        fastload.mix([small_dataset, small_dataset], weights=[1.0])
    with pytest.raises(ValueError, match="must all be positive"):
        fastload.mix([small_dataset, small_dataset], weights=[1.0, 0.0])
    with pytest.raises(ValueError, match="stop must be"):
        fastload.mix([small_dataset, small_dataset], weights=[1, 1], stop="never")
    with pytest.raises(ValueError, match="a mixture and indices"):
        ShardLoader(fastload.mix([small_dataset], weights=[1]), indices=[0])


def mixture(small_dataset, second, stop, with_source=True):
    return fastload.mix([small_dataset, second], weights=[0.7, 0.3], stop=stop, with_source=with_source)


@pytest.mark.parametrize("shuffle", [False, True])
def test_mix_stop_modes_cover_what_they_should(small_dataset, second_zstd, shuffle):
    def read(stop, epoch=0):
        loader = ShardLoader(mixture(small_dataset, second_zstd, stop), batch_size=16, shuffle=shuffle, seed=8)
        loader.set_epoch(epoch)
        length = len(loader)  # of this epoch (a mixture's epochs differ in length)
        batches = list(loader)
        return labels(batches), torch.cat([b["source"] for b in batches]).tolist(), length

    for epoch in range(3):
        got, src, length = read("first_exhausted", epoch)
        assert length == math.ceil(len(got) / 16)
        counts = np.bincount(src, minlength=2)
        assert counts[0] <= 103 and counts[1] <= 40 and (counts[0] == 103 or counts[1] == 40)
        assert len(set(got)) == len(got)  # nobody exhausted before the end: no repeats
        last = src[-1]  # the epoch ends on the last sample of the exhausted source
        assert counts[last] == (103, 40)[last]
        assert all((x >= 10000) == s for x, s in zip(got, src))
        got, src, _ = read("all_exhausted", epoch)
        assert set(got) == {7 * i for i in range(103)} | {10000 + i for i in range(40)}
        counts = np.bincount(src, minlength=2)
        assert counts[src[-1]] in (103, 40) and min(counts[0] - 103, counts[1] - 40) == 0
    got, src, length = read(1000)
    assert len(got) == 1000 and length == 63
    share = np.mean(src)
    assert abs(share - 0.3) < 0.05  # 1000 draws: the standard deviation is 0.0145
    rounds = [got[i] for i in range(1000) if src[i] == 1]
    for r in range(len(rounds) // 40):  # each round of the small source reads it all once
        assert sorted(rounds[40 * r: 40 * (r + 1)]) == [10000 + i for i in range(40)]
    if not shuffle:
        assert rounds[:40] == [10000 + i for i in range(40)]


def test_mix_proportions(small_dataset, second_zstd):
    loader = ShardLoader(mixture(small_dataset, second_zstd, 20_000), batch_size=1000, shuffle=True, seed=1,
                         fields=["label"])
    src = torch.cat([b["source"] for b in loader]).numpy()
    stat, limit = chi_square_ok(np.bincount(src, minlength=2), np.array([0.7, 0.3]))
    assert stat < limit


# ---- the loader's promises, for every mode ----------------------------------------------------

MODES = ["subset", "subset-shuffled", "weights", "weights-norepl", "concat", "mix-first", "mix-all", "mix-n",
         "mix-layouts", "window", "window-concat"]


@pytest.fixture(scope="module")
def second_zstd_and_raw(second_zstd, second_dataset):
    return second_zstd, second_dataset


def make_loader(mode, small, seconds, **kw):
    """A loader of ``mode`` over the test datasets (``kw`` override the defaults)."""
    second, second_raw = seconds
    args = {"batch_size": 7, "seed": 11, "num_workers": 0, **kw}
    if mode.startswith("subset"):
        return ShardLoader(small, indices=list(range(100, 0, -3)), shuffle=mode.endswith("shuffled"), **args)
    weights = np.linspace(0.1, 2.0, 103)
    if mode == "weights":
        return ShardLoader(small, sample_weights=weights, num_samples=90, **args)
    if mode == "weights-norepl":
        return ShardLoader(small, sample_weights=weights, num_samples=90, replacement=False, **args)
    if mode == "concat":
        return ShardLoader(fastload.concat([small, second], with_source=True), shuffle=True, **args)
    if mode == "window":  # 4 shards of 30, 30, 30, 13: windows of 2 shards
        return ShardLoader(small, shuffle=True, shuffle_window=2, **args)
    if mode == "window-concat":  # 4 + 3 shards of two datasets (raw and zstd: a native reader per layout)
        return ShardLoader(fastload.concat([small, second_raw], with_source=True), shuffle=True, shuffle_window=3,
                           **args)
    if mode == "mix-layouts":  # another codec in the second dataset: a native reader per layout
        return ShardLoader(mixture(small, second_raw, "all_exhausted"), shuffle=True, **args)
    stop = {"mix-first": "first_exhausted", "mix-all": "all_exhausted", "mix-n": 150}[mode]
    return ShardLoader(mixture(small, second, stop), shuffle=True, **args)


@pytest.mark.parametrize("mode", MODES)
def test_both_backends_and_thread_counts_agree(small_dataset, second_zstd_and_raw, mode):
    runs = []
    for backend, threads in (("native", 1), ("native", 3), ("torch", 1)):
        loader = make_loader(mode, small_dataset, second_zstd_and_raw, backend=backend, num_threads=threads)
        runs.append([clone(b) for b in loader] + [clone(b) for b in loader])  # two epochs
    assert len(runs[0]) > 2
    assert batches_equal(runs[0], runs[1]) and batches_equal(runs[0], runs[2])


def run_resume_check(make, stop_after, epoch=0):
    """Save after ``stop_after`` batches of ``epoch``, load into a new loader: the batches of an uninterrupted run."""
    reference = make()
    reference.set_epoch(epoch)
    full = [clone(b) for b in reference] + [clone(b) for b in reference]
    first = make()
    first.set_epoch(epoch)
    it = iter(first)
    head = [clone(next(it)) for _ in range(stop_after)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    second = make()
    second.load_state_dict(state)
    tail = [clone(b) for b in second] + [clone(b) for b in second]
    assert batches_equal(head + tail[: len(full) - stop_after], full)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_resume_mid_epoch_is_exact(small_dataset, second_zstd_and_raw, mode, backend):
    n = len(make_loader(mode, small_dataset, second_zstd_and_raw))
    for stop_after in (0, 3, n):
        run_resume_check(lambda: make_loader(mode, small_dataset, second_zstd_and_raw, backend=backend), stop_after,
                         epoch=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("saved_world", "resumed_world"), [(3, 2), (2, 3)])
def test_elastic_resume_continues_the_global_sequence(small_dataset, second_zstd_and_raw, mode, saved_world,
                                                      resumed_world):
    single = make_loader(mode, small_dataset, second_zstd_and_raw, batch_size=1)
    sequence = labels(list(single))  # the whole epoch's global sequence, in order
    steps, batch = 2, 3
    seen, states = [], []
    for rank in range(saved_world):
        loader = make_loader(mode, small_dataset, second_zstd_and_raw, batch_size=batch, rank=rank,
                             world_size=saved_world)
        it = iter(loader)
        seen += labels([next(it) for _ in range(steps)])
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    consumed = steps * batch * saved_world
    assert states[0]["position"] == consumed and sorted(seen) == sorted(sequence[:consumed])
    rest = []
    for rank in range(resumed_world):
        loader = make_loader(mode, small_dataset, second_zstd_and_raw, batch_size=batch, rank=rank,
                             world_size=resumed_world, even_batches=False)
        loader.load_state_dict(states[0])
        rest += labels(list(loader))
    assert sorted(rest) == sorted(sequence[consumed:])  # nothing skipped, nothing repeated


@pytest.mark.parametrize("mode", MODES)
def test_ranks_partition_the_epoch(small_dataset, second_zstd_and_raw, mode):
    world = 3
    sequence = labels(list(make_loader(mode, small_dataset, second_zstd_and_raw, batch_size=1)))
    even = [list(make_loader(mode, small_dataset, second_zstd_and_raw, rank=r, world_size=world)) for r in range(world)]
    assert len({len(b) for b in even}) == 1  # equal batch counts
    exact = [labels(list(make_loader(mode, small_dataset, second_zstd_and_raw, rank=r, world_size=world,
                                     even_batches=False))) for r in range(world)]
    assert sorted(sum(exact, [])) == sorted(sequence)  # disjoint positions, the whole epoch
    loader = make_loader(mode, small_dataset, second_zstd_and_raw, rank=1, world_size=world)
    assert len(loader) == len(even[1])


def test_states_of_another_configuration_are_refused(small_dataset, second_zstd_and_raw):
    state = make_loader("weights", small_dataset, second_zstd_and_raw).state_dict()
    assert len(json.dumps(state)) < 600
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, batch_size=7, seed=11).load_state_dict(state)
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, batch_size=7, seed=11, sample_weights=np.ones(103),
                    num_samples=90).load_state_dict(state)
    with pytest.raises(StateError, match="sampling"):
        make_loader("weights-norepl", small_dataset, second_zstd_and_raw).load_state_dict(state)
    subset = make_loader("subset", small_dataset, second_zstd_and_raw).state_dict()
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, indices=[1, 2, 3], batch_size=7, seed=11).load_state_dict(subset)
    mixed = make_loader("mix-first", small_dataset, second_zstd_and_raw).state_dict()
    with pytest.raises(StateError, match="this loader samples None"):
        make_loader("concat", small_dataset, second_zstd_and_raw).load_state_dict(mixed)
    with pytest.raises(StateError, match="another dataset"):
        ShardLoader(fastload.concat([small_dataset, second_zstd_and_raw[0]]), batch_size=7, seed=11,
                    shuffle=True).load_state_dict(mixed)
    other_stop = make_loader("mix-all", small_dataset, second_zstd_and_raw)
    with pytest.raises(StateError, match="sampling"):
        other_stop.load_state_dict(mixed)
    with pytest.raises(StateError, match="invalid epoch"):
        make_loader("mix-first", small_dataset, second_zstd_and_raw).load_state_dict({**mixed, "position": 10_000})
    plain = ShardLoader(small_dataset, batch_size=7, seed=11).state_dict()
    assert "sampling" not in plain  # the plain loader's state is unchanged


def test_pickled_loader_keeps_its_sampling(small_dataset, second_zstd_and_raw):
    import pickle

    for mode in ("subset-shuffled", "weights", "mix-first", "window"):
        loader = make_loader(mode, small_dataset, second_zstd_and_raw)
        it = iter(loader)
        next(it)
        copy = pickle.loads(pickle.dumps(loader))
        assert copy.state_dict() == loader.state_dict()
        assert batches_equal(list(it), list(copy))


def test_torch_backend_workers_read_mixtures_like_the_native_backend(small_dataset, second_dataset):
    mixed = fastload.mix([small_dataset, second_dataset], weights=[1, 1], stop="all_exhausted", with_source=True)
    native = [clone(b) for b in ShardLoader(mixed, batch_size=8, shuffle=True, seed=2, backend="native")]
    forked = [clone(b) for b in ShardLoader(mixed, batch_size=8, shuffle=True, seed=2, backend="torch",
                                            num_workers=2)]
    assert batches_equal(native, forked)
    assert {int(s) for b in forked for s in b["source"]} == {0, 1}
    with pytest.raises(IndexError, match="out of range for 143 samples"):
        mixed.read_batch([0, 143])
