"""kvcodec_sdk.quantization: the buffer policy and lossless lists shared by quantizing codecs."""

import pytest

import kvcodec_sdk as kv
from kvcodec_sdk import quantization as q
from kvcodec_sdk.errors import CodecParamError

HALF = (kv.DType.BFLOAT16, kv.DType.FLOAT16)


def _spec() -> q.QuantizingCodecSpec:
    return q.QuantizingCodecSpec(name="quant", description="test", version="0", format_version=1, lossless=False,
                                 error_bound="|x - y| <= 1", factory=lambda: None, params=q.LOSSLESS_PARAMS)


def _buf(layer=0, role=kv.Role.KEY, dtype=kv.DType.BFLOAT16, shaped=True) -> kv.BufferDesc:
    t, h, d = (4, 2, 16) if shaped else (0, 0, 0)
    return kv.BufferDesc(layer_id=layer, role=role, bytes=4 * 2 * 16 * 2, dtype=dtype, tokens_per_page=t,
                         num_heads=h, head_dim=d)


def test_split_list_strips_and_drops_empty_items():
    assert q.split_list(" key, ,value ,") == ["key", "value"]
    assert q.split_list("") == []


def test_quantizes_k_and_v_of_the_codec_dtypes_only_when_shaped():
    assert q.quantizes(_buf(role=kv.Role.KEY), {}, HALF)
    assert q.quantizes(_buf(role=kv.Role.VALUE, dtype=kv.DType.FLOAT16), None, HALF)
    assert not q.quantizes(_buf(role=kv.Role.OTHER), {}, HALF)
    assert not q.quantizes(_buf(dtype=kv.DType.FLOAT32), {}, HALF)
    assert q.quantizes(_buf(dtype=kv.DType.FLOAT32), {}, (*HALF, kv.DType.FLOAT32))
    assert not q.quantizes(_buf(shaped=False), {}, HALF)


def test_lossless_roles_and_layers_exclude_buffers():
    params = _spec().validate_params({"lossless_roles": "value", "lossless_layers": "0, 31"})
    assert not q.quantizes(_buf(layer=5, role=kv.Role.VALUE), params, HALF)
    assert q.quantizes(_buf(layer=5, role=kv.Role.KEY), params, HALF)
    assert not q.quantizes(_buf(layer=31, role=kv.Role.KEY), params, HALF)
    assert not q.quantizes(_buf(layer=0, role=kv.Role.KEY), params, HALF)


@pytest.mark.parametrize("lossless, quantized", [("", True), ("key", False), ("value", False), ("other", True)])
def test_a_key_value_buffer_is_quantized_unless_key_or_value_is_kept_lossless(lossless, quantized):
    params = _spec().validate_params({"lossless_roles": lossless})
    assert q.quantizes(_buf(role=kv.Role.KEY_VALUE), params, HALF) is quantized


@pytest.mark.parametrize("params,words", [
    ({"lossless_roles": "key,query"}, ["'quant'", "'lossless_roles'", "'query'", "'key', 'value', 'other'"]),
    ({"lossless_layers": "0,-1"}, ["'quant'", "'lossless_layers'", "'-1'", "non-negative layer ids"]),
    ({"lossless_layers": "1234567890"}, ["'lossless_layers'", "'1234567890'"]),
])
def test_bad_list_items_are_refused_naming_codec_parameter_item_and_what_is_valid(params, words):
    with pytest.raises(CodecParamError) as info:
        _spec().validate_params(params)
    for word in words:
        assert word in str(info.value)


def test_defaults_are_empty_lists_and_a_schema_without_them_is_not_checked():
    assert _spec().validate_params(None) == {"lossless_roles": "", "lossless_layers": ""}
    plain = q.QuantizingCodecSpec(name="p", description="", version="0", format_version=1, lossless=False,
                                 error_bound="|x - y| <= 1", factory=lambda: None)
    assert plain.validate_params({}) == {}
