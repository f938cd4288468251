"""Conformance: checked decode of damaged blobs and the cold-page envelope."""

from __future__ import annotations

import numpy as np
import pytest

from .. import envelope
from ..clauses import clause, violated
from ._fixtures import (
    PAGES,
    BaseFixtures,
    _blame_round_trip,
    _classes,
    _diff,
    _flip_bit,
)


class BaseCheckedDecodeTests(BaseFixtures):
    @clause("checked-decode")
    @_blame_round_trip
    def test_checked_decode(self, make_harness, kvcodec_spec):
        h = make_harness()
        if not h.codec.has_checked_decode:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no checked decode (optional, plugin ABI 2)")
        for rep in _classes(h):
            src, back = h.pages(rep, PAGES)
            n = len(src)
            cold = h.cold_buffer(rep, 2 * n + 1, clause="checked-decode")
            dst = h.spread_blobs(n)
            h.must("encode", rep, cold.base, h.index_array(rep, dst, src), clause="checked-decode")
            h.sync()
            status = h.status_buffer(n)
            h.must_decode_checked(rep, cold.base, h.index_array(rep, back, dst), status, clause="checked-decode")
            h.sync()
            got = status.read()[:n]
            if np.any(got != 0):
                raise violated("checked-decode", f"lifecycle {rep}: decodeChecked() reported statuses "
                                                 f"{got.tolist()} for {n} good blobs; every entry must be 0 (kPageOk)")
            h.check_decoded(rep, src, back, clause="checked-decode", context="decodeChecked(encode(x))")
            h.restore_hot()
            if not kvcodec_spec.envelope:
                continue
            # Damage: the magic, the envelope header (its CRC covers it) and the last payload byte
            # the envelope covers, one page each; the other pages must decode as before.
            raw = cold.read_all()
            blobs = cold.blobs(raw)
            damaged = {0: (0, 0), 1: (12, 3)}
            for k in range(2, n):
                payload = int(blobs[dst[k]][12:16].view("<u4")[0])
                header = int(blobs[dst[k]][8:12].view("<u4")[0])
                flags = int(blobs[dst[k]][6:8].view("<u2")[0])
                if flags & 4 == 0 and payload > 0:
                    damaged[k] = (header + payload - 1, 5)
                    break
            for k, (offset, bit) in damaged.items():
                _flip_bit(cold, int(dst[k]), offset, bit)
            h.fill_hot_slots(h.plan.group_of(rep), back)
            status = h.status_buffer(n)
            h.must_decode_checked(rep, cold.base, h.index_array(rep, back, dst), status, clause="checked-decode")
            h.sync()
            got = status.read()[:n]
            for k in range(n):
                if k in damaged and got[k] == 0:
                    raise violated("checked-decode", f"lifecycle {rep}: blob {int(dst[k])} has bit {damaged[k][1]} of "
                                                     f"byte {damaged[k][0]} flipped but decodeChecked() reported "
                                                     "status 0 (kPageOk) for it")
                if k not in damaged and got[k] != 0:
                    raise violated("checked-decode", f"lifecycle {rep}: blob {int(dst[k])} is intact but "
                                                     f"decodeChecked() reported status {int(got[k])} for it")
            good = np.array([k for k in range(n) if k not in damaged], dtype=np.int64)
            h.check_decoded(rep, src[good], back[good], clause="checked-decode",
                            context="the intact neighbours of damaged blobs")
            h.restore_hot()


class BaseEnvelopeTests(BaseFixtures):
    @clause("envelope")
    @_blame_round_trip
    def test_envelope(self, make_harness, kvcodec_spec):
        name = "envelope"
        if not kvcodec_spec.envelope:
            pytest.skip(f"codec {kvcodec_spec.name!r} does not declare the cold-page envelope")
        for layout in ("mixed", "tiny-odd"):
            h = make_harness(layout)
            for rep in _classes(h):
                g = h.plan.group_of(rep)
                src, back = h.pages(rep, PAGES)
                n = len(src)
                dst = h.spread_blobs(n)
                cold = h.cold_buffer(rep, 2 * n + 1, clause=name)
                h.must("encode", rep, cold.base, h.index_array(rep, dst, src), clause=name)
                h.sync()
                raw = cold.read_all()
                blobs = cold.blobs(raw)
                fits = []
                for k in range(n):
                    problem = envelope.field_problems(blobs[dst[k]], kvcodec_spec.format_version,
                                                      h.plan.groups[g].page_bytes)
                    if problem:
                        raise violated(name, f"lifecycle {rep} ({layout}), blob {int(dst[k])} (encoded from hot slot "
                                             f"{int(src[k])}): {problem}")
                    if not envelope.parse(blobs[dst[k]]).did_not_fit:
                        fits.append(k)
                # Bytes past headerBytes + payloadBytes are covered by neither CRC: damaging them must
                # not change what decode writes.
                flipped = []
                for k in fits:
                    blob = blobs[dst[k]]
                    end = envelope.parse(blob).covered_end
                    for offset in sorted({end, (end + blob.size) // 2, blob.size - 1}):
                        if end <= offset < blob.size:
                            blob[offset] ^= np.uint8(0x81)
                            flipped.append((k, offset))
                if not flipped:
                    continue
                good = np.array(fits)
                h.must("decode", rep, cold.base, h.index_array(rep, back[good], dst[good]), clause=name)
                h.sync()
                expected = h.hot_raw()[g]
                cold.region.write(raw)  # the damaged copy
                h.fill_hot_slots(g, back[good])
                h.must("decode", rep, cold.base, h.index_array(rep, back[good], dst[good]), clause=name)
                h.sync()
                for p, (x, y) in enumerate(zip(expected, h.hot_raw()[g])):
                    x, y = h.hot_slots(x, g, p)[back[good]], h.hot_slots(y, g, p)[back[good]]
                    for i, k in enumerate(good):
                        if not np.array_equal(x[i], y[i]):
                            where = [o for kk, o in flipped if kk == k]
                            end = envelope.parse(cold.blobs()[dst[k]]).covered_end
                            raise violated(name, f"lifecycle {rep} ({layout}), blob {int(dst[k])}: bytes {where} lie "
                                                 f"after headerBytes + payloadBytes ({end}), outside what the CRCs "
                                                 f"cover, yet damaging them changed the decoded page in pool {p} "
                                                 f"({_diff(x[i], y[i])}): a damaged blob would pass the envelope check "
                                                 "and decode to a wrong page")
                h.restore_hot()


