"""The release ledger's size and speed: bytes per released conversion of a row set, and the time to
compute row ids, merge a release's set and check it against earlier releases; the canonical id hash
and the coarse identity per id type (ids per second); and, with ``--coincidences DIR``, how often the
coarse identity (impression id, second modulo 15 minutes) and the minute identity (impression id,
minute, or a neighbouring one) of different conversions coincide on realistic daily logs (the
false-positive side of the lossy re-export refusal).

    .venv/bin/python benchmarks/ledger.py [--sizes 1000000,10000000] [--releases 10] [--figures FILE]
    .venv/bin/araopt synth --preset synth-criteo --target-conversions 1000000 --seed 1 --days 21 \
        --partition-by conversion-date --split test --output /tmp/daily
    .venv/bin/python benchmarks/ledger.py --coincidences /tmp/daily/test

Conversions as in benchmarks/measure.py (~10 per impression, times over 30 days, int64 ids). ``--figures``
also writes the size and speed figures as the Markdown table ``docs/performance.md`` shows.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from araopt.io.rowset import (  # noqa: E402
    COARSE_MARGIN_US,
    LOSSY_OVERLAP_SHARE,
    MINUTE_MARGIN_US,
    RowSet,
    RowSetPart,
    coarse_row_ids,
    conversion_row_ids,
    minute_row_ids,
    released_near,
    released_shifted,
)
from figures import markdown_table, write_figure  # noqa: E402

BATCH = 1 << 20


def release(n: int, seed: int) -> tuple[RowSet, RowSet, RowSet, float, float]:
    """(row set, coarse and minute row sets of n synthetic conversions, CPU seconds to hash them in batches,
    CPU seconds to merge)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, max(1, n // 10), n) + seed * n
    times = rng.integers(1_700_000_000_000_000, 1_702_592_000_000_000, n)
    start = time.process_time()
    parts = [RowSetPart.of_table(pa.table({"impression_id": ids[i:i + BATCH], "conversion_time_us": times[i:i + BATCH]}))
             for i in range(0, n, BATCH)]
    hashed = time.process_time() - start
    start = time.process_time()
    rows, coarse = RowSet.merge(parts), RowSet.merge(p.coarse_part() for p in parts)
    minute = RowSet.merge(p.minute_part() for p in parts)
    return rows, coarse, minute, hashed, time.process_time() - start


def id_speed(n: int) -> None:
    """Ids per second (CPU time) of the exact and the coarse identity, per id type."""

    rng = np.random.default_rng(5)
    ints = rng.integers(0, max(1, n // 10), n)
    times = rng.integers(1_700_000_000_000_000, 1_702_592_000_000_000, n)
    kinds = {"int64": ints, "decimal strings": pa.array(ints.astype(str)),
             "zero-padded strings": pa.array(np.char.zfill(ints.astype(str), 12)),
             "other strings": pa.array(np.char.add("imp-", ints.astype(str)))}
    for name, ids in kinds.items():
        for what, fn in (("exact", conversion_row_ids), ("coarse", coarse_row_ids)):
            start = time.process_time()
            for i in range(0, n, BATCH):
                fn(ids[i:i + BATCH], times[i:i + BATCH])
            took = time.process_time() - start
            print(f"{n:>11,} {name:<20} {what:<6} ids: {took:5.2f} s CPU ({n / took / 1e6:5.1f}M ids/s)")


def coincidences(folder: str) -> None:
    """Per day of a date-partitioned daily log: the share of its conversions whose coarse identity
    matches a conversion of (a) the releases whose windows come within 26 h of it (what the ledger
    compares), (b) the earlier days' conversions within 26 h before its first one (what the --lookback
    check compares), (c) every earlier day (for scale: why the lookback check is limited to 26 h), and
    the exact matches (none expected); then the same for the minute identity (the impression and its
    minute, matched at a neighbouring minute too: ``released_near``) against the earlier days, and
    against the other half of the same day released separately (the worst case: windows that overlap);
    then the minute identity's best time-zone shift (``released_shifted``: the share of a sample matching at
    the one shift that matches most) against the earlier days within 26 h and against the other half-day."""
    import glob

    import pyarrow.parquet as pq

    days = []
    for path in sorted(glob.glob(os.path.join(folder, "date=*"))):
        table = pq.read_table(path, columns=["impression_id", "conversion_time"])
        us = table.column("conversion_time").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
        ids = table.column("impression_id")
        coarse_ids = coarse_row_ids(ids, us)
        minute = RowSet.merge([RowSetPart(minute_row_ids(ids, us), int(np.min(us)), int(np.max(us)))])
        half = np.random.default_rng(len(days)).random(len(us)) < 0.5
        halves = tuple(RowSet.merge([RowSetPart(minute_row_ids(ids.filter(pa.array(h)), us[h]), None, None)])
                       for h in (half, ~half))
        days.append((os.path.basename(path), RowSet.merge([RowSetPart(conversion_row_ids(ids, us), None, None)]),
                     RowSet.merge([RowSetPart(coarse_ids, int(np.min(us)), int(np.max(us)))]), coarse_ids, us,
                     minute, halves))
    print(f"{'day':<16}{'conversions':>12}{'ledger':>10}{'lookback 26 h':>15}{'all earlier':>13}{'exact':>7}"
          f"{'minute ledger':>15}{'minute half-day':>17}{'shift ledger':>14}{'shift half-day':>16}")
    shares = []
    for k, (name, exact, coarse, _, us, minute, halves) in enumerate(days):
        if k == 0 or len(us) < 1000:
            continue
        near = [c.ids for _, _, c, _, _, _, _ in days[:k] if coarse.may_meet(c.first_time_us, c.last_time_us,
                                                                             COARSE_MARGIN_US)]
        ledger = np.count_nonzero(sum(coarse.contained_in(ids).astype(np.int64) for ids in near)) / len(coarse)
        since = coarse.first_time_us - COARSE_MARGIN_US
        recent = np.unique(np.concatenate([c[t >= since] for _, _, _, c, t, _, _ in days[:k]]))
        lookback = np.count_nonzero(coarse.contained_in(recent)) / len(coarse)
        every = np.unique(np.concatenate([c.ids for _, _, c, _, _, _, _ in days[:k]]))
        all_earlier = np.count_nonzero(coarse.contained_in(every)) / len(coarse)
        exact_hits = sum(int(np.count_nonzero(exact.contained_in(e.ids))) for _, e, _, _, _, _, _ in days[:k])
        by_minute = released_near(minute, [m.ids for _, _, _, _, _, m, _ in days[:k]
                                           if minute.may_meet(m.first_time_us, m.last_time_us, MINUTE_MARGIN_US)])
        half_day = released_near(halves[1], [halves[0].ids])
        shift = released_shifted(minute, [m.ids for _, _, _, _, _, m, _ in days[:k]
                                          if minute.may_meet(m.first_time_us, m.last_time_us, COARSE_MARGIN_US)])
        shift_half = released_shifted(halves[1], [halves[0].ids])
        shares.append((ledger, lookback, all_earlier, by_minute / len(minute), half_day / len(halves[1]),
                       shift.matched / max(shift.sampled, 1), shift_half.matched / max(shift_half.sampled, 1)))
        print(f"{name:<16}{len(us):>12,}{ledger:>10.3%}{lookback:>15.3%}{all_earlier:>13.3%}{exact_hits:>7}"
              f"{shares[-1][3]:>15.4%}{shares[-1][4]:>17.4%}{shares[-1][5]:>14.3%}{shares[-1][6]:>16.3%}")
    arr = np.array(shares)
    print(f"max over {len(arr)} days: ledger {arr[:, 0].max():.3%}, lookback within 26 h {arr[:, 1].max():.3%}, "
          f"all earlier days {arr[:, 2].max():.3%} (refusal above {LOSSY_OVERLAP_SHARE:.0%})")
    print(f"minute identity, max over {len(arr)} days: against the earlier days {arr[:, 3].max():.4%} (mean "
          f"{arr[:, 3].mean():.4%}), a half-day against the day's other half {arr[:, 4].max():.4%} (mean "
          f"{arr[:, 4].mean():.4%}) (refusal above {LOSSY_OVERLAP_SHARE:.0%})")
    print(f"minute identity at its best time-zone shift, max over {len(arr)} days: against the earlier days "
          f"{arr[:, 5].max():.3%} (mean {arr[:, 5].mean():.3%}), a half-day against the day's other half "
          f"{arr[:, 6].max():.3%} (mean {arr[:, 6].mean():.3%}) (refusal above {LOSSY_OVERLAP_SHARE:.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--releases", type=int, default=10, help="earlier releases to check a new one against")
    parser.add_argument("--id-speed", type=int, default=0, metavar="N", help="only: ids per second over N ids per type")
    parser.add_argument("--coincidences", metavar="DIR", help="only: coarse coincidences over DIR/date=*/ daily logs")
    parser.add_argument("--figures", help="also write the figures as a Markdown table to this file")
    args = parser.parse_args()
    if args.id_speed:
        id_speed(args.id_speed)
        return
    if args.coincidences:
        coincidences(args.coincidences)
        return
    rows_out: list[list[str]] = []
    for n in (int(s) for s in args.sizes.split(",")):
        rows, _, _, hashed, merged = release(n, seed=0)
        data = rows.to_parquet_bytes()
        start = time.perf_counter()
        RowSet.from_parquet_bytes(data)
        read = time.perf_counter() - start
        print(f"{n:>11,} conversions: exact, coarse + minute ids {hashed:5.2f} s CPU ({n / hashed / 1e6:5.1f}M/s), "
              f"merge {merged:5.2f} s, "
              f"row set {len(data):>11,} bytes = {len(data) / len(rows):.2f} bytes per conversion "
              f"({len(data) * 1e6 / len(rows) / 2**20:.2f} MiB per 10^6; read back {read:.2f} s)")
        rows_out.append([f"row set of one release of {n:,} conversions (sorted 64-bit ids, delta-packed Parquet: the "
                        f"exact identities; the coarse and minute ones are two more)",
                         f"{len(data) / len(rows):.2f} bytes per conversion; exact, coarse + minute ids "
                         f"{n / hashed / 1e6:.1f}M per CPU second"])
    n = int(args.sizes.split(",")[0])
    with tempfile.TemporaryDirectory() as root:
        os.environ["ARAOPT_LEDGER"] = root
        from araopt.ledger.ledger import Ledger

        ledger = Ledger.open(root, allow_rerelease=True)
        for k in range(args.releases):
            rows, coarse, minute, _, _ = release(n, seed=k + 1)
            ledger.check_and_record(rows, rows.to_parquet_bytes(), {}, coarse=coarse, minute=minute)
        ledger_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(root) for f in fs)
        rows, coarse, minute, _, _ = release(n, seed=1)  # a re-release of the first one; every window meets every other
        start = time.process_time()
        recorded = ledger.check_and_record(rows, rows.to_parquet_bytes(), {}, coarse=coarse, minute=minute)
        took = time.process_time() - start
    print(f"ledger of {args.releases} releases of {n:,} conversions: {ledger_bytes:,} bytes on disk = "
          f"{ledger_bytes / (args.releases * n):.2f} bytes per released conversion (index included)")
    print(f"check + record (exact, coarse and minute) of {n:,} conversions against those {args.releases} releases: "
          f"{took:.2f} s CPU (overlap found: {recorded.rows_released_before:,} exact, "
          f"{recorded.entry['coarse_rows_released_before']:,} coarse, {recorded.entry['minute_rows_released_before']:,} "
          f"minute)")
    rows_out.append([f"ledger of {args.releases} releases of {n:,} conversions (index included)",
                    f"{ledger_bytes / (args.releases * n):.2f} bytes per released conversion"])
    rows_out.append([f"check + record (exact, coarse and minute) of {n:,} conversions against those "
                     f"{args.releases} releases, whose windows meet", f"{took:.2f} s CPU"])
    if args.figures:
        write_figure(args.figures, markdown_table(["what (`benchmarks/ledger.py`)", "figure"], rows_out))
        print(f"wrote {args.figures}")


if __name__ == "__main__":
    main()
