"""KVCacheManager construction: configuration, init steps 1-7, level mappings, pool-ratio
projection, batching-class validation and consumptive codec ownership (host backend)."""

from __future__ import annotations

import pytest
from test_kvcm_support import config, group, make_test_codec

import kvcodec_sdk as kv
from kvcodec_sdk import (
    BufferDesc,
    CacheLevel,
    KVCacheConfig,
    KVCacheConfigError,
    KVCacheManager,
    LayerGroupConfig,
    Role,
)
from kvcodec_sdk.errors import CodecConsumedError


def assert_consumed(codec):
    assert codec.consumed
    with pytest.raises(CodecConsumedError, match="consumed by a KVCacheManager"):
        codec.cold_page_bytes(0)


# -- configuration ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda c: KVCacheConfig([], 1 << 16, device="cpu"), r"KVCacheConfig.layer_groups is \[\]"),
        (lambda c: config([group([0], [64]), LayerGroupConfig([BufferDesc(0, Role.KEY, bytes=0)])]),
         r"KVCacheConfig.layer_groups\[1\].buffers\[0\].bytes is 0; it must be positive"),
        (lambda c: config([LayerGroupConfig([])]), r"layer_groups\[0\].buffers is empty"),
        (lambda c: config([group([0], [64])], gpu_quota=0), r"KVCacheConfig.gpu_quota is 0"),
        (lambda c: config([group([0], [64])], host_quota=-1), r"KVCacheConfig.host_quota is -1"),
        (lambda c: config([group([0], [64])], pool_ratio=[1, 2]), r"pool_ratio has 2 entries; it needs one per layer group \(1\)"),
        (lambda c: config([group([0], [64])], pool_ratio=[0.0]), r"pool_ratio\[0\] is 0.0"),
        (lambda c: config([LayerGroupConfig([BufferDesc(0, Role.KEY, bytes=64, dtype=kv.DType.FLOAT16, tokens_per_page=4, num_heads=2, head_dim=0)])]),
         r"buffers\[0\] sets tokens_per_page/num_heads/head_dim to \(4, 2, 0\)"),
        (lambda c: config([LayerGroupConfig([BufferDesc(0, Role.KEY, bytes=64, dtype=kv.DType.FLOAT16, tokens_per_page=4, num_heads=2, head_dim=2)])]),
         r"buffers\[0\].bytes is 64 but tokens_per_page\*num_heads\*head_dim\*itemsize is 32"),
        (lambda c: config([LayerGroupConfig([BufferDesc(0, Role.KEY, bytes=63, dtype=kv.DType.FLOAT16)])]),
         r"bytes is 63, not a multiple of the FLOAT16 item size 2"),
        (lambda c: config([group([0], [64])], index_ring_bytes=100), r"index_ring_bytes is 100; it must be a multiple of 8"),
        (lambda c: config([LayerGroupConfig([BufferDesc(0, Role.KEY_VALUE, bytes=96, dtype=kv.DType.FLOAT16, tokens_per_page=4, num_heads=3, head_dim=4)])]),
         r"buffers\[0\].num_heads is 3; a KEY_VALUE buffer alternates K and V along its heads, so it needs an even number"),
    ],
)
def test_config_errors_name_the_field(mutate, field):
    codec = make_test_codec()
    with pytest.raises(KVCacheConfigError, match=field):
        KVCacheManager(mutate(None), cold_page_codec=codec)
    assert_consumed(codec)  # consumed on failure too


def test_hot_quota_below_one_page_names_the_quota_and_layer_groups():
    with pytest.raises(ValueError, match=r"config.gpuQuotaBytes is 100: hot pool group 0 \(layer groups \[0\], 128 bytes per page\)"):
        KVCacheManager(config([group([0], [64, 64])], gpu_quota=100))


# -- ownership ----------------------------------------------------------------------------------

def test_codec_is_consumed_on_success():
    codec = kv.create_codec("concat", device="cpu")
    m = KVCacheManager(config([group([0], [64])]), cold_page_codec=codec)
    assert_consumed(codec)
    assert m.codec_name == "concat"
    pages = m.allocate(0, 2)
    assert m.evict(pages).moved == 2


def test_codec_is_consumed_when_native_construction_fails():
    codec = make_test_codec(reject_configure=True)
    with pytest.raises(ValueError, match="rejected the hot layout.*reject_configure=true"):
        KVCacheManager(config([group([0], [64])]), cold_page_codec=codec)
    assert_consumed(codec)


def test_codec_is_consumed_when_the_config_type_is_wrong():
    codec = make_test_codec()
    with pytest.raises(TypeError, match="pass a kvcodec_sdk.KVCacheConfig"):
        KVCacheManager({"layer_groups": []}, cold_page_codec=codec)
    assert_consumed(codec)


def test_a_consumed_codec_cannot_be_passed_again():
    codec = make_test_codec()
    KVCacheManager(config([group([0], [64])]), cold_page_codec=codec)
    with pytest.raises(CodecConsumedError):
        KVCacheManager(config([group([0], [64])]), cold_page_codec=codec)


def test_codec_by_name_and_with_params():
    m = KVCacheManager(config([group([0], [64])]), cold_page_codec="concat")
    assert m.codec_name == "concat" and m.cold_page_bytes(0) == 64
    m = KVCacheManager(config([group([0], [64, 32])]), cold_page_codec=("concat", {"path": "copy_engine"}))
    assert m.cold_page_bytes(0) == 96
    with pytest.raises(kv.UnknownCodecError, match="unknown codec 'nope'"):
        KVCacheManager(config([group([0], [64])]), cold_page_codec="nope")
    with pytest.raises(TypeError, match="cold_page_codec is a int"):
        KVCacheManager(config([group([0], [64])]), cold_page_codec=3)


def test_default_codec_is_concat_on_the_host_backend():
    m = KVCacheManager(config([group([0, 1], [64, 32])]))
    assert m.device == "cpu" and m.codec_name == "concat"
    assert m.cold_page_bytes(0) == 2 * (64 + 32)
    assert m.page_index_location(0) == kv.PageIndexLocation.HOST


def test_gpu_only_manager_still_configures_the_codec():
    # Step 3 runs without a cold tier: an invalid codec is rejected the same way.
    codec = make_test_codec(reject_configure=True)
    with pytest.raises(ValueError, match="rejected the hot layout"):
        KVCacheManager(config([group([0], [64])], host_quota=0), cold_page_codec=codec)
    assert_consumed(codec)
    codec = make_test_codec(zero_size="0")
    with pytest.raises(ValueError, match="0 cold-page bytes for layer group 0"):
        KVCacheManager(config([group([0], [64])], host_quota=0), cold_page_codec=codec)
    m = KVCacheManager(config([group([0], [64])], host_quota=0))
    assert m.num_pool_groups(CacheLevel.HOST) == 0 and m.lifecycle_to_pool_group(CacheLevel.HOST) == []
    pages = m.allocate(0, 1)
    with pytest.raises(ValueError, match="host level, which this manager does not have"):
        m.evict(pages)


# -- mappings -------------------------------------------------------------------------------------

def test_identical_slot_layouts_share_a_hot_pool_group():
    m = KVCacheManager(config([group([0, 1], [64]), group([2, 3], [64]), group([4], [64, 64]), group([5], [32])]))
    # One pool per layer: layer groups 0 and 1 have two 64-byte pools each (shared group 0);
    # layer group 2 has one layer with K and V, one 128-byte pool; layer group 3 one 32-byte pool.
    assert m.lifecycle_to_pool_group(CacheLevel.HOT) == [0, 0, 1, 2]
    assert [m.page_bytes(CacheLevel.HOT, g) for g in range(3)] == [128, 128, 32]


def test_lifecycles_sharing_a_hot_group_map_to_different_cold_groups():
    codec = make_test_codec(pad="1:24")
    m = KVCacheManager(config([group([0], [64]), group([1], [64]), group([2], [64])]), cold_page_codec=codec)
    assert m.lifecycle_to_pool_group(CacheLevel.HOT) == [0, 0, 0]
    assert m.lifecycle_to_pool_group(CacheLevel.HOST) == [0, 1, 0]
    assert [m.cold_page_bytes(l) for l in range(3)] == [64, 88, 64]
    assert m.page_bytes(CacheLevel.HOST, 1) == 88
    # Statistics are keyed per level: one hot group, two cold groups.
    assert len(m.stats(CacheLevel.HOT)) == 1 and len(m.stats(CacheLevel.HOST)) == 2


def test_different_hot_groups_share_a_cold_group():
    # Two 64-byte pools vs one 128-byte pool: different hot layouts, same 128-byte concat blob.
    m = KVCacheManager(config([group([0, 1], [64]), group([2], [64, 64])]))
    assert m.lifecycle_to_pool_group(CacheLevel.HOT) == [0, 1]
    assert m.lifecycle_to_pool_group(CacheLevel.HOST) == [0, 0]
    assert m.num_pool_groups(CacheLevel.HOST) == 1


def test_pool_ratio_is_projected_per_layer_group_through_each_level():
    # Layer groups 0 and 1 share a hot group (128-byte pages); 2 has its own (64-byte pages).
    # Cold pages: 0 -> 128, 1 -> 128 + 64 (own cold group), 2 -> 64 + 64 = 128 (shares with 0).
    ratio = [1.0, 3.0, 4.0]
    gpu, host = 64 * 1024, 96 * 1024
    codec = make_test_codec(pad="1:64,2:64")
    m = KVCacheManager(config([group([0], [64, 64]), group([1], [64, 64]), group([2], [64])],
                              gpu_quota=gpu, host_quota=host, pool_ratio=ratio), cold_page_codec=codec)
    w = [r / sum(ratio) for r in ratio]
    hot_page = [128, 128, 64]
    cold_page = [128, 192, 128]
    assert m.lifecycle_to_pool_group(CacheLevel.HOT) == [0, 0, 1]
    assert m.lifecycle_to_pool_group(CacheLevel.HOST) == [0, 1, 0]
    hot_slots = [c for c, _ in m.slot_counts(CacheLevel.HOT)]
    assert hot_slots == [int((w[0] + w[1]) * gpu // 128), int(w[2] * gpu // 64)]
    # Cold: hot byte weight -> slot-count weight -> cold bytes, summed per cold group.
    slots = [w[l] * gpu / hot_page[l] for l in range(3)]
    cold_bytes = [slots[0] * cold_page[0] + slots[2] * cold_page[2], slots[1] * cold_page[1]]
    total = sum(cold_bytes)
    expect = [int(host * cold_bytes[0] / total // 128), int(host * cold_bytes[1] / total // 192)]
    assert [c for c, _ in m.slot_counts(CacheLevel.HOST)] == expect
    # Layer-group slot proportions survive the projection: group 1 had 3/(1+4 slots-equivalents)...
    assert expect[1] / expect[0] == pytest.approx(slots[1] / (slots[0] + slots[2]), rel=0.02)


# -- batching validation --------------------------------------------------------------------------

THREE_SAME = [group([0], [64]), group([1], [64]), group([2], [64])]


@pytest.mark.parametrize(
    "groups, params, message",
    [
        (THREE_SAME, {"batching": "0:7"}, r"layer group 0 has batching representative 7, which is not a configured layer group \(valid: 0..2\)"),
        (THREE_SAME, {"batching": "0:1"}, r"layer group 0 has batching representative 1, which is greater than the member"),
        (THREE_SAME, {"batching": "1:0,2:1"}, r"layer group 2 has batching representative 1, but layer group 1 maps to representative 0, not to itself"),
        ([group([0], [64]), group([1], [32])], {"batching": "1:0"}, r"layer group 1 has batching representative 0 but they are in different hot pool groups \(1 and 0\)"),
        (THREE_SAME, {"batching": "1:0", "pad": "1:8"}, r"layer group 1 has batching representative 0 but their cold-page sizes differ \(72 and 64 bytes\)"),
        (THREE_SAME, {"batching": "1:0", "location": "1:device"}, r"layer group 1 has batching representative 0 but their page-index locations differ \(device and host\)"),
        (THREE_SAME, {"batching": "2:-1"}, r"batching representative -1 for layer group 2 \(getBatchingLayerGroupId failed\)"),
        (THREE_SAME, {"location": "1:bad"}, r"page-index location -1 for layer group 1"),
        (THREE_SAME, {"zero_size": "2"}, r"0 cold-page bytes for layer group 2"),
    ],
    ids=["unconfigured", "greater", "not-self", "hot-group", "cold-size", "location", "negative", "bad-location", "zero-size"],
)
def test_batching_validation_failures(groups, params, message):
    codec = make_test_codec(**params)
    with pytest.raises(ValueError, match=message):
        KVCacheManager(config(groups), cold_page_codec=codec)
    assert_consumed(codec)


def test_a_valid_batching_class_is_accepted():
    m = KVCacheManager(config(THREE_SAME), cold_page_codec=make_test_codec(batching="1:0,2:0"))
    assert [m.batching_representative(l) for l in range(3)] == [0, 0, 0]
