"""A long sequence of codec calls on one codec, checked against a model of the pools.

Every other test starts from a fresh codec and fresh buffers. This one keeps one codec and one
cold buffer per batching class for a few hundred random steps over every lifecycle:

- *encode* some hot slots into cold slots, often into cold slots that already hold a blob of the
  same hot slot, after that slot was overwritten;
- *decode* stored blobs into hot slots, often into the slot a blob was encoded from after it was
  overwritten, with another member of the batching class than the one that encoded it;
- *overwrite* hot slots with new KV-like pages;

then a burst of many one-page calls, and finally a decode of every stored blob. The model holds
what every hot slot and every cold slot must contain. Each decode is checked against it at once
(byte for byte for a lossless codec, within the bound for a lossy one), and at the end every hot
slot must hold exactly what the model says: a codec that caches blobs, reads a hot slot when it
should read the blob, or writes where it should not, shows up with the step that exposed it.
The sequence is a pure function of the seed, so a failure replays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .clauses import violated
from .data import fill_page_bytes
from .harness import Harness, first_difference

__all__ = ["run_sequence"]


@dataclass
class _Blob:
    step: int
    lifecycle: int
    hot: int
    page: list[np.ndarray]  # per pool: (slot_bytes,)

    def origin(self, overwritten: bool) -> str:
        text = f"the page encoded at step {self.step} by lifecycle {self.lifecycle} from hot slot {self.hot}"
        return text + (" (which has been overwritten since)" if overwritten else "")


class _Model:
    def __init__(self, h: Harness, cold_slots: int):
        self.h = h
        self.hot = [[a.copy() for a in pools] for pools in h.original]  # per group, pool: (slots, slot_bytes)
        self.cold: dict[int, list[_Blob | None]] = {rep: [None] * cold_slots for rep in h.classes()}
        self.written: dict[tuple[int, int], int] = {}  # (group, hot slot) -> step of its last overwrite

    def page(self, g: int, slot: int) -> list[np.ndarray]:
        return [a[slot].copy() for a in self.hot[g]]


def run_sequence(h: Harness, *, clause: str, steps: int = 400, burst: int = 2000, cold_slots: int = 8) -> None:
    rng = np.random.default_rng(0x57A7E)
    classes = h.classes()
    rep_of = {m: rep for rep, members in classes.items() for m in members}
    lifecycles = h.plan.lifecycle_ids
    cold = {rep: h.cold_buffer(rep, cold_slots, clause=clause) for rep in classes}
    model = _Model(h, cold_slots)
    recent: dict[int, list[tuple[int, int]]] = {rep: [] for rep in classes}  # (hot, cold) pairs encoded

    def slots_of(lc: int) -> int:
        return h.plan.groups[h.plan.group_of(lc)].num_slots

    def encode(step: int, lc: int, hot: np.ndarray, dst: np.ndarray) -> None:
        rep, g = rep_of[lc], h.plan.group_of(lc)
        h.must("encode", lc, cold[rep].base, h.index_array(lc, dst, hot), clause=clause)
        h.sync()
        for s, c in zip(hot, dst):
            model.cold[rep][int(c)] = _Blob(step, lc, int(s), model.page(g, int(s)))
            recent[rep].append((int(s), int(c)))
        del recent[rep][:-16]

    def decode(step: int, lc: int, src: np.ndarray, back: np.ndarray, what: str) -> None:
        rep, g = rep_of[lc], h.plan.group_of(lc)
        h.must("decode", lc, cold[rep].base, h.index_array(lc, back, src), clause=clause)
        h.sync()
        blobs = [model.cold[rep][int(c)] for c in src]
        want = [np.stack([b.page[p] for b in blobs]) for p in range(len(model.hot[g]))]
        origin = [b.origin(model.written.get((g, b.hot), -1) > b.step) for b in blobs]
        raw = h.group_raw(g)
        h.check_pages(lc, want, back, clause=clause, origin=origin, raw=raw,
                      context=f"{what}: decode(lifecycle {lc}, cold slots {src.tolist()} -> hot slots {back.tolist()})")
        for p in range(len(model.hot[g])):
            model.hot[g][p][back] = h.hot_slots(raw[p], g, p)[back]

    def overwrite(step: int, g: int, slots: np.ndarray) -> None:
        group = h.plan.groups[g]
        pages = [fill_page_bytes(rng, pool.slot_bytes, len(slots),
                                 [b for b in group.lifecycles[0].buffers if b.pool_index == p])
                 for p, pool in enumerate(group.pools)]
        h.write_hot_pages(g, slots, pages)
        for p in range(len(pages)):
            model.hot[g][p][slots] = pages[p]
        for s in slots:
            model.written[(g, int(s))] = step

    for step in range(steps):
        lc = int(rng.choice(lifecycles))
        rep, g = rep_of[lc], h.plan.group_of(lc)
        k = int(rng.integers(1, 4))
        stored = [c for c, b in enumerate(model.cold[rep]) if b is not None]
        roll = rng.random()
        if roll < 0.2:
            overwrite(step, g, rng.choice(slots_of(lc), min(k, slots_of(lc)), replace=False))
        elif roll < 0.6 or not stored:
            # Encode; half the time again into cold slots that hold a blob of the same hot slot.
            pairs = list({c: s for s, c in recent[rep]}.items()) if rng.random() < 0.5 else []
            rng.shuffle(pairs)
            pairs = pairs[:k]
            if pairs:
                hot = np.array([s for _, s in pairs])
                dst = np.array([c for c, _ in pairs])
                if rng.random() < 0.7:  # make the re-encoded page new
                    overwrite(step, g, np.unique(hot))
            else:
                hot = rng.choice(slots_of(lc), min(k, slots_of(lc)), replace=False)
                dst = rng.choice(cold_slots, len(hot), replace=False)
            encode(step, lc, hot, dst)
        else:
            src = rng.choice(stored, min(k, len(stored)), replace=False)
            if rng.random() < 0.5:  # back into the slots the blobs came from (one blob per slot)
                origin = {model.cold[rep][int(c)].hot: int(c) for c in src}
                back, src = np.array(list(origin)), np.array(list(origin.values()))
            else:
                back = rng.choice(slots_of(lc), len(src), replace=False)
            member = int(rng.choice(classes[rep]))  # any member of the class decodes the class's blobs
            decode(step, member, src, back, f"step {step} of the sequence")

    # Many small calls on one codec: resources must not run out and the results stay right.
    lc = lifecycles[0]
    rep, g = rep_of[lc], h.plan.group_of(lc)
    n = slots_of(lc)
    for i in range(burst):
        s, c = i % n, i % cold_slots
        if i % 2 == 0:
            encode(steps + i, lc, np.array([s]), np.array([c]))
        else:
            stored = [x for x, b in enumerate(model.cold[rep]) if b is not None]
            src, back = np.array([stored[i % len(stored)]]), np.array([(s * 7 + 3) % n])
            if i % 50 == 1:
                decode(steps + i, lc, src, back, f"call {steps + i} of the sequence")
            else:  # checked by the final decode of every blob and the final look at every hot slot
                _decode_unchecked(h, lc, cold[rep], src, back, model, clause)

    # Every stored blob still decodes to its page; then every hot slot holds what the model says.
    end = steps + burst
    for rep, members in classes.items():
        g = h.plan.group_of(rep)
        stored = np.array([c for c, b in enumerate(model.cold[rep]) if b is not None])
        for chunk in np.array_split(stored, max(1, -(-len(stored) // max(1, h.plan.groups[g].num_slots // 2)))):
            if len(chunk):
                back = rng.choice(h.plan.groups[g].num_slots, len(chunk), replace=False)
                decode(end, members[-1], chunk, back, "at the end of the sequence")
    for g, pools in enumerate(h.hot_raw()):
        for p, raw in enumerate(pools):
            got = h.hot_slots(raw, g, p)
            for s in np.flatnonzero((got != model.hot[g][p]).any(axis=1)):
                raise violated(clause, f"at the end of a sequence of {end} calls, hot slot {int(s)} of pool {p} of hot "
                                       f"pool group {g} does not hold what the calls left there: "
                                       f"{first_difference(model.hot[g][p][s], got[s])}")


def _decode_unchecked(h: Harness, lc: int, cold, src: np.ndarray, back: np.ndarray, model: _Model, clause: str) -> None:
    """A burst decode: the page is checked later (the model takes it as decoded correctly only
    for a lossless codec; for a lossy one it reads the slot back)."""
    g = h.plan.group_of(lc)
    rep = h.batching(lc)
    h.must("decode", lc, cold.base, h.index_array(lc, back, src), clause=clause)
    blob = model.cold[rep][int(src[0])]
    if h.spec.lossless:
        for p in range(len(model.hot[g])):
            model.hot[g][p][back[0]] = blob.page[p]
    else:
        h.sync()
        raw = h.group_raw(g)
        for p in range(len(model.hot[g])):
            model.hot[g][p][back] = h.hot_slots(raw[p], g, p)[back]
