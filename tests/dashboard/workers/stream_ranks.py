"""Worker: log fast on every rank while streaming; write what was recorded to a file.

argv: address steps out_dir [max_batch]; the HMAC key comes hex-encoded in
CK_TEST_KEY. Prints ``LOGGED {json}`` when the loop is done (before the notebook
side reads anything), ``BLOCKED {json}`` once the publisher found the socket full (or
after 60 s), ``FLUSHED {json}`` once everything is on the wire.
"""

import json
import os
import sys
import time

import torch

from clusterkernel import comm, metrics
from clusterkernel.metrics import _stream

address, steps, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
max_batch = int(sys.argv[4]) if len(sys.argv) > 4 else 20_000
key = bytes.fromhex(os.environ["CK_TEST_KEY"])
rank = comm.rank()
rec = metrics.recorder()

metrics.log(step=-1, loss=99.0)  # before the stream starts: must still arrive
pub = _stream.Publisher(address, key, rec, interval=0.05, max_batch=max_batch).start()
t0 = time.perf_counter()
for i in range(steps):
    metrics.log(step=i, loss=1.0 / (i + 1) + rank, samples_per_s=float(i % 7))
    if i % 1000 == 0:
        with metrics.span("compute"):
            x = torch.full((256,), float(rank))
        comm.all_reduce(x)
loop_s = time.perf_counter() - t0
totals = {k: rec.total(k) for k in ("comm", "scalar", "span")}
print("LOGGED " + json.dumps({"rank": rank, "loop_s": loop_s, "totals": totals}), flush=True)
# The notebook reads nothing yet: once the socket and the kernel's buffers are full the
# publisher must hold back and retry. Say when it has (a deadline, not a wait on time).
deadline = time.monotonic() + 60
while pub.full_waits == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
print("BLOCKED " + json.dumps({"rank": rank, "full_waits": pub.full_waits}), flush=True)
seq = pub.flush(timeout=120)
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(rec.records(), f)
print("FLUSHED " + json.dumps({"rank": rank, "seq": seq, "full_waits": pub.full_waits}), flush=True)
pub.stop()
