"""Checks an `oomshim export --memory-viz` pickle against what PyTorch's memory viewer reads
(torch/cuda/_memory_viz.py and torch/utils/viz/MemoryViz.js), without torch: the GPU machine
runs torch's own functions on it too (tests/gpu/check_memory_viz.py).

    python3 tests/memory_viz_check.py SNAPSHOT.pickle

Prints one JSON line of counts and exits 0, or names the first violation and exits 1.
Standard library only."""

import json
import pickle
import pickletools
import sys

# The opcodes MemoryViz.js's own unpickler implements; any other throws "UNKNOWN OPCODE".
VIEWER_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET",
    "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET",
    "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT",
    "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "BINFLOAT",
}
# Integers beyond this become BigInt (or lose precision) in the viewer.
MAX_SAFE = 2**53 - 1
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def check_opcodes(raw):
    for op, arg, _ in pickletools.genops(raw):
        need(op.name in VIEWER_OPCODES, f"opcode {op.name} is not one the viewer's unpickler knows")
        if op.name == "PROTO":
            need(2 <= arg <= 4, f"pickle protocol {arg}: the viewer reads 2 to 4")
        if isinstance(arg, int) and op.name in ("LONG1", "BININT"):
            need(-MAX_SAFE <= arg <= MAX_SAFE, f"integer {arg:#x} does not fit a JavaScript number")


def check_frames(frames, where):
    need(isinstance(frames, list), f"{where}: frames is not a list")
    for f in frames:
        need(isinstance(f.get("filename"), str) and isinstance(f.get("name"), str)
             and isinstance(f.get("line"), int), f"{where}: frame {f!r} lacks filename/line/name")


def check(data):
    need(isinstance(data, dict), "the snapshot is not a dict")
    segments, traces = data.get("segments"), data.get("device_traces")
    need(isinstance(segments, list) and isinstance(traces, list), "no segments or device_traces")
    blocks_at = {}  # (device, addr) -> (segment address, block)
    seg_at = {}
    n_blocks = 0
    for i, seg in enumerate(segments):
        for k in ("device", "address", "total_size", "stream", "blocks"):
            need(k in seg, f"segment {i} has no {k}")
        dev = seg["device"]
        need(isinstance(dev, int) and 0 <= dev < len(traces), f"segment {i}: device {dev} has no trace list")
        need(seg["total_size"] > 0, f"segment {i} is empty")
        # The viewer computes each block's address from the segment's and the sizes before it.
        addr = seg["address"]
        seg_at[(dev, addr)] = seg
        allocated = free_internal = free_external = 0
        for b in seg["blocks"]:
            need(b.get("state") in BLOCK_STATES, f"segment {i}: block state {b.get('state')!r}")
            need(b.get("address", addr) == addr, f"segment {i}: block address {b.get('address')} "
                 f"is not where the viewer puts it ({addr})")
            check_frames(b.get("frames", []), f"segment {i} block at {addr}")
            if b["state"] == "active_allocated":
                req = b["requested_size"]
                need(0 < req <= b["size"], f"segment {i}: requested {req} of a {b['size']} block")
                allocated += req
                free_internal += b["size"] - req
            else:
                free_external += b["size"]
            if b["state"] != "inactive":
                blocks_at[(dev, addr)] = (seg["address"], b)
            addr += b["size"]
            n_blocks += 1
        # torch's segsum() asserts exactly this.
        need(allocated + free_internal + free_external == seg["total_size"],
             f"segment {i}: blocks add up to {addr - seg['address']}, not {seg['total_size']}")
    spans = sorted((d, a, a + s["total_size"]) for (d, a), s in seg_at.items())
    for x, y in zip(spans, spans[1:]):
        need(x[0] != y[0] or x[2] <= y[1], f"segments overlap at {y[1]:#x}")
    n_events = 0
    for dev, trace in enumerate(traces):
        for e in trace:
            n_events += 1
            need(e.get("action") in ACTIONS, f"device {dev}: action {e.get('action')!r}")
            check_frames(e.get("frames", []), f"device {dev} {e['action']}")
            if e["action"] == "oom":
                need(isinstance(e.get("size"), int) and isinstance(e.get("device_free"), int),
                     "the oom event needs size and device_free")
            elif e["action"] == "alloc":
                hit = blocks_at.get((dev, e["addr"]))
                need(hit is not None and hit[1]["state"] == "active_allocated",
                     f"alloc at {e['addr']:#x} names no allocated block")
                need(e["size"] == hit[1]["requested_size"], f"alloc at {e['addr']:#x}: size differs from its block")
            elif e["action"] == "segment_alloc":
                s = seg_at.get((dev, e["addr"]))
                need(s is not None and s["total_size"] == e["size"], f"segment_alloc at {e['addr']:#x} names no segment")
        # Replay the trace backwards as the viewer's Allocator State History does: every undone
        # event must find what it removes, and no live block may be left without its segment.
        live_blocks = {a: s for (d, a), (s, _) in blocks_at.items() if d == dev}
        live_segs = {a for (d, a) in seg_at if d == dev}
        for e in reversed(trace):
            if e["action"] == "alloc":
                need(e["addr"] in live_blocks, f"undoing alloc {e['addr']:#x}: no such block")
                del live_blocks[e["addr"]]
            elif e["action"] == "segment_alloc":
                need(e["addr"] in live_segs, f"undoing segment_alloc {e['addr']:#x}: no such segment")
                live_segs.discard(e["addr"])
                orphans = [a for a, s in live_blocks.items() if s == e["addr"]]
                need(not orphans, f"segment {e['addr']:#x} is created after its block {orphans[:1]}")
    return {"segments": len(segments), "blocks": n_blocks, "events": n_events,
            "devices": len(traces), "max_address": max((a for (_, a) in seg_at), default=0)}


def main(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        check_opcodes(raw)
        print(json.dumps(check(pickle.loads(raw))))
    except Bad as e:
        print(f"memory_viz check: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
