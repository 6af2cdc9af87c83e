"""What does packing one scalar record for the metric stream cost: JSON vs column frames?

    .venv/bin/python benchmarks/bench_dashboard_encode.py

(issue 6; no MPI, no lock needed; seconds.) 20,000 records ``(step, time, {loss,
samples_per_s})`` packed as one batch: ``json.dumps`` of the tuples vs
``clusterkernel.protocol._wire.encode`` (the binary column frames the ranks send), and decoding
the frames to tuples and to columns (as the notebook does); best of 5, microseconds per
record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bench_encode(n: int = 20_000, repeat: int = 5) -> dict:
    """Microseconds per record to pack a batch: JSON of the tuples vs the column frames."""
    from clusterkernel.protocol import _wire

    items = [
        (i, time.perf_counter(), {"loss": 1.0 / (i + 1), "samples_per_s": float(i)})
        for i in range(n)
    ]
    msg = {"v": _wire.VERSION, "rank": 0, "seq": 1, "scalar": items}

    def best(fn) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / n * 1e6

    frames = _wire.encode(b"k", msg)
    return {
        "json_us": best(lambda: json.dumps(items, separators=(",", ":"))),
        "columns_us": best(lambda: _wire.encode(b"k", msg)),
        "decode_us": best(lambda: _wire.decode(b"k", frames)),
        "decode_columns_us": best(lambda: _wire.decode(b"k", frames, columns=True)),
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    res = bench_encode()
    print("RESULT encode " + json.dumps(res))
    print(
        f"\nencode, per scalar record: JSON {res['json_us']:.2f} us, "
        f"column frames {res['columns_us']:.2f} us (decode to tuples {res['decode_us']:.2f} us, "
        f"to columns as the notebook does {res['decode_columns_us']:.3f} us)"
    )


if __name__ == "__main__":
    main()
