"""Token shards streamed from an object store through the node's bounded cache
(largetrain_core.cache.ShardCache), and the sampler's shuffle by windows of shards; on fsspec's
memory:// store (the S3 server's tests: tests/integration/test_train.py)."""

import threading
import time

import fsspec
import numpy as np
import pytest
import xxhash

from helpers.parts import sentence_docs
from largetrain_core.cache import CacheFullError, ShardCache, parse_bytes
from largetrain_core.shards import DistributedSampler, TokenShards, build_token_shards
from largetrain_core.storage import atomic_dir


@pytest.fixture
def mem():
    fsys = fsspec.filesystem("memory")
    yield fsys
    for d in ("/cache-unit", "/shards-unit"):
        if fsys.exists(d):
            fsys.rm(d, recursive=True)


def _object(mem, name: str, size: int, fill: int) -> tuple[str, int, str]:
    data = bytes([fill]) * size
    mem.pipe_file(f"/cache-unit/{name}", data)
    return f"memory://cache-unit/{name}", size, xxhash.xxh3_128_hexdigest(data)


def test_sizes_are_read_as_kubernetes_writes_them():
    assert parse_bytes("64Gi") == 64 << 30 and parse_bytes("500G") == 500 * 10**9 and parse_bytes(1024) == 1024
    assert parse_bytes("1.5TiB") == int(1.5 * 2**40)
    with pytest.raises(ValueError, match="not a size in bytes"):
        parse_bytes("lots")


def test_the_cache_stays_within_its_bound_evicting_unused_files_least_recently_used_first(tmp_path, mem):
    cache = ShardCache(tmp_path / "c", max_bytes=250, wait_seconds=0.5)
    a, b, c = (_object(mem, n, 100, i) for i, n in enumerate("abc"))
    cache.fetch(*a)
    cache.fetch(*b)
    with cache.pin(*a) as pinned_a:  # a is in use (and now the most recently used)
        cache.fetch(*c)  # 300 > 250: b, unused, goes
        assert pinned_a.path.read_bytes() == bytes([0]) * 100
        assert cache.used_bytes() == 200 and not cache._entry(*b[:2]).exists()
        with cache.pin(*c):
            with pytest.raises(CacheFullError, match="in shards that are in use"):
                cache.fetch(*b)  # a and c are both held: no room
    cache.fetch(*b)  # released: a, the least recently used, goes
    assert not cache._entry(*a[:2]).exists() and cache._entry(*b[:2]).exists()
    assert cache.fetched_bytes == 400 and cache.peak_bytes() <= 250
    big = _object(mem, "big", 300, 9)
    with pytest.raises(CacheFullError, match="larger than the shard cache's bound of 250 bytes"):
        cache.fetch(*big)


def test_a_file_is_fetched_once_by_concurrent_readers_and_checked(tmp_path, mem):
    caches = [ShardCache(tmp_path / "c", max_bytes=10_000) for _ in range(4)]  # four ranks of one node
    obj = _object(mem, "shared", 1000, 7)
    threads = [threading.Thread(target=lambda c=c: c.pin(*obj).close()) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.fetched_bytes for c in caches) == 1000
    url, size, _ = _object(mem, "bad", 1000, 1)
    with pytest.raises(OSError, match="xxh3-128 differs from the manifest"):
        caches[0].fetch(url, size, "0" * 32)
    assert not list((tmp_path / "c").glob("*-bad")) and not list((tmp_path / "c").glob("*.part"))  # nothing kept


def _shards(tmp_path, bpe_dir, sentences, per_shard: int) -> tuple:
    docs = sentence_docs(tmp_path / "docs", sentences)
    url = "memory://shards-unit/token_shards/v1"
    with atomic_dir(url) as out:
        build_token_shards(docs, bpe_dir, out, seq_len=16, validation_fraction=0.1, sequences_per_shard=per_shard)
    local = tmp_path / "local"
    local.mkdir()
    build_token_shards(docs, bpe_dir, local, seq_len=16, validation_fraction=0.1, sequences_per_shard=per_shard)
    return url, local


@pytest.mark.parametrize("holds", ["all", "two"])
def test_streamed_shards_read_as_the_local_ones(tmp_path, bpe_dir, sentences, mem, monkeypatch, holds):
    """Every sequence streamed equals the local file's, with a cache holding all shards or only two."""
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    url, local = _shards(tmp_path, bpe_dir, sentences, per_shard=16)
    here = TokenShards(local, "train")
    size = max(e["bytes"] for e in here.manifest["splits"]["train"]["shards"])
    bound_shards = len(here.manifest["splits"]["train"]["shards"]) + 1 if holds == "all" else 2
    monkeypatch.setenv("LARGETRAIN_SHARD_CACHE_BYTES", str(bound_shards * size))
    there = TokenShards(url, "train")
    assert len(there) == len(here) > 64 and len(there.shard_sizes) > 4 and there.remote
    order = np.random.default_rng(0).permutation(len(here))
    for i in range(0, len(order), 8):
        assert np.array_equal(there.take(order[i : i + 8]), here.take(order[i : i + 8]))
    assert np.array_equal(there[3], here[3])
    assert there.cache.peak_bytes() <= bound_shards * size
    assert there.max_open == (len(there.shard_sizes) if holds == "all" else 1)
    # with every file held, take gathers over one flat list of batches, as from a local directory
    assert (there._flat is not None) == (holds == "all")
    there.close()
    assert there._flat is None and np.array_equal(there.take(order[:8]), here.take(order[:8]))  # pinned again
    there.close()


def test_follow_prefetches_the_shards_the_sampler_reads_next(tmp_path, bpe_dir, sentences, mem, monkeypatch):
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    url, _ = _shards(tmp_path, bpe_dir, sentences, per_shard=16)
    data = TokenShards(url, "train")
    sampler = DistributedSampler(len(data), seed=3, shard_sizes=tuple(data.shard_sizes), window_shards=2)
    data.follow(sampler, 4, lambda: 0)  # a cache holding the split: every shard, in the order of first use
    files = {
        e: data._shard_cache()._entry(data._url(e), data._entries[e]["bytes"]) for e in range(len(data.shard_sizes))
    }
    total = sum(e["bytes"] for e in data.manifest["splits"]["train"]["shards"])
    # a guard against a prefetch that never ends, not a speed check (0.6 s alone; over 60 s once at the end of a
    # loaded run of the whole suite, the cause not found)
    deadline = time.monotonic() + 600
    # the prefetch thread counts a download after it renames the file into place: wait for both
    while not (data.cache.fetched_bytes >= total and all(p.exists() for p in files.values())):
        assert time.monotonic() < deadline, f"prefetched {sum(p.exists() for p in files.values())} of {len(files)}"
        time.sleep(0.05)
    assert data.cache.fetched_bytes == total  # each shard once
    data.take(sampler.indices(0, 4))
    assert data.cache.fetched_bytes == total  # the read found them there
    data.close()


def test_the_prefetch_thread_and_the_reader_make_one_cache(tmp_path, bpe_dir, sentences, mem, monkeypatch):
    """Two threads asking for a streamed directory's cache at once get the same one (two caches split the byte
    counts and the bound: the prefetch test above once waited 600 s on a count kept by the other cache)."""
    import threading

    from largetrain_core.cache import ShardCache

    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    url, _ = _shards(tmp_path, bpe_dir, sentences, per_shard=16)
    data = TokenShards(url, "train")
    made = []
    init = ShardCache.__init__

    def slow_init(self, *a, **k):  # widen the window in which a second thread would make its own
        made.append(self)
        time.sleep(0.2)
        init(self, *a, **k)

    monkeypatch.setattr(ShardCache, "__init__", slow_init)
    got = []
    threads = [threading.Thread(target=lambda: got.append(data._shard_cache())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(c is data.cache for c in got)
    data.close()


def test_the_window_shuffle_is_a_pure_function_of_seed_and_epoch():
    sizes = (5, 7, 3, 6, 4)
    s = DistributedSampler(sum(sizes), seed=1, shard_sizes=sizes, window_shards=2)
    for epoch in (0, 1):
        perm = s.permutation(epoch)
        assert sorted(perm.tolist()) == list(range(sum(sizes)))  # every sequence once per epoch
        again = DistributedSampler(sum(sizes), seed=1, shard_sizes=sizes, window_shards=2).permutation(epoch)
        assert np.array_equal(perm, again)
        starts = np.cumsum((0,) + sizes)
        order = np.random.Generator(np.random.PCG64([1, epoch])).permutation(len(sizes))
        at = 0
        for w in range(0, len(sizes), 2):  # each window reads exactly its shards' sequences, then the next begins
            group = order[w : w + 2]
            n = sum(sizes[g] for g in group)
            assert set(perm[at : at + n].tolist()) == {i for g in group for i in range(starts[g], starts[g + 1])}
            at += n
    assert not np.array_equal(s.permutation(0), s.permutation(1))
    assert np.array_equal(DistributedSampler(25, seed=1).permutation(0), DistributedSampler(25, seed=1).permutation(0))
    with pytest.raises(ValueError, match="window_shards needs shard_sizes"):
        DistributedSampler(24, shard_sizes=sizes, window_shards=2)
    state = s.state_dict()
    other = DistributedSampler(sum(sizes), seed=1)
    with pytest.raises(ValueError, match="window_shards"):
        other.load_state_dict(state)
