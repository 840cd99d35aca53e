"""Latency of the per-conversion trigger registration an ad server builds (araopt.ara.TriggerEncoder).

    python benchmarks/ara.py [--repeat 5] [--number 20000]

Prints µs per call (best of --repeat runs of --number calls) for the paper's worked example and
larger configurations, with the default OS-CSPRNG rounding, a numpy Generator, and for comparison
the vectorized core encoder called on a (1, d) array.
"""
from __future__ import annotations

import argparse
import timeit

import numpy as np

from araopt import KeyDomain, Params, QueryParams, encode
from araopt.ara.registrations import SourceEncoder, TriggerEncoder
from araopt.mechanism.params import Encoding, L1Rounding

L1_RANDOMIZED = "l1-randomized"
"""The case of L1 with Alg. 6's randomized rounding (the other cases are ``Encoding`` values)."""


def _params(case: str, d: int, conversion_side: bool) -> Params:
    extra: dict = {}
    encoding = Encoding.L1 if case == L1_RANDOMIZED else Encoding(case)
    if encoding == Encoding.L1:
        queries = tuple(QueryParams(f"q{i}", 10.0 + i) for i in range(d))
        if case == L1_RANDOMIZED:
            extra["l1_rounding"] = L1Rounding.RANDOMIZED
    elif encoding == Encoding.BASELINE:
        queries = tuple(QueryParams(f"q{i}", 10.0 + i, 0.8 / d) for i in range(d))
        extra["count_budget_fraction"] = 0.2
    else:
        queries = tuple(QueryParams(f"q{i}", 10.0 + i, 1.0 / d) for i in range(d))
    return Params(count_limit=2, encoding=encoding, epsilon=8.0, slice_columns=("campaign", "device"),
                  conversion_slice_columns=("device",) if conversion_side else (), queries=queries, **extra)


def _domain(params: Params) -> KeyDomain:
    n = 200
    cols = {"campaign": np.array([f"c{i % 50}" for i in range(n)]),
            "device": np.array(["desktop", "mobile", "tablet", "tv"] * (n // 4))}
    return KeyDomain.from_slice_values(params.slice_columns, cols, params.query_columns,
                                       baseline=params.encoding == Encoding.BASELINE,
                                       conversion_slice_columns=params.conversion_slice_columns)


def _best_us(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    rows = []
    du_penc = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                     queries=(QueryParams("items", 2.0, 0.5), QueryParams("value", 30.0, 0.5)))
    dom = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array(["Thanksgiving", "Christmas"])},
                                      du_penc.query_columns)
    enc = TriggerEncoder(du_penc, dom)
    record = {"items": 3, "value": 21.0}
    gen = np.random.default_rng(0)
    rows.append(("worked example (d=2, linf): registration, OS CSPRNG",
                 _best_us(lambda: enc.registration(record), args.number, args.repeat)))
    rows.append(("worked example: registration, numpy Generator",
                 _best_us(lambda: enc.registration(record, rng=gen), args.number, args.repeat)))
    rows.append(("worked example: header (JSON string), OS CSPRNG",
                 _best_us(lambda: enc.header(record), args.number, args.repeat)))
    arr = np.array([[3.0, 21.0]])
    rows.append(("worked example: core encode() on a (1, d) array only",
                 _best_us(lambda: encode(arr, du_penc, gen), args.number, args.repeat)))
    sources = SourceEncoder(du_penc, dom)
    rows.append(("worked example: source registration lookup",
                 _best_us(lambda: sources.registration({"campaign": "Thanksgiving"}), args.number, args.repeat)))
    for encoding in (Encoding.LINF, Encoding.L1, L1_RANDOMIZED, Encoding.BASELINE):
        for d in (2, 10, 19):
            params = _params(encoding, d, conversion_side=True)
            enc_d = TriggerEncoder(params, _domain(params))
            rec = {f"q{i}": 3.0 + i for i in range(d)}
            slice_values = {"device": "mobile"}
            rows.append((f"{encoding:<13} d={d:<2} + conversion-side slice: registration",
                         _best_us(lambda enc_d=enc_d, rec=rec, slice_values=slice_values:
                                  enc_d.registration(rec, slice_values), args.number // 2, args.repeat)))
    width = max(len(name) for name, _ in rows)
    print(f"{'case':<{width}}  µs/call")
    for name, us in rows:
        print(f"{name:<{width}}  {us:7.2f}")


if __name__ == "__main__":
    main()
