"""Timestamps are read by their unit everywhere (pandas writes nanoseconds), floored to the microsecond."""
import numpy as np
import pandas as pd
import pyarrow as pa

from araopt.data.split import split_table
from araopt.io.conversions import IMPRESSION_TIME, IMPRESSION_TIME_US, Conversions, validate_batch

NS = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20.123456789Z


def test_impression_time_in_nanoseconds_becomes_microseconds_and_bad_ones_are_dead_lettered():
    table = pa.table({
        "impression_id": [1, 2, 3],
        "conversion_time": pa.array([NS + 5_000, NS + 6_000, NS + 7_000], pa.timestamp("ns", tz="UTC")),
        "s": [1, 1, 2], "value": [1.0, 2.0, 3.0],
        IMPRESSION_TIME: pa.array([NS, None, NS - 86_400 * 10**9], pa.timestamp("ns")),
    })
    batch = validate_batch(table, ["s"], ["value"], passthrough=(IMPRESSION_TIME,))
    assert batch.valid.column(IMPRESSION_TIME_US).to_pylist() == [NS // 1000, (NS - 86_400 * 10**9) // 1000]
    assert batch.rejected.column("reason").to_pylist() == ["bad_impression_time"]
    conv = Conversions.from_table(batch.valid, ["s"], ["value"])
    assert conv.impression_time is not None and conv.impression_time.tolist() == [NS // 1000, (NS - 86_400 * 10**9) // 1000]
    # one UTC day apart, whatever the unit: days computed from microseconds
    assert np.diff(conv.impression_time // 86_400_000_000).tolist() == [-1]


def test_split_reads_a_pandas_nanosecond_column():
    frame = pd.DataFrame({"impression_id": [1, 2], "conversion_time": pd.to_datetime([NS, NS + 2_000_000_000], utc=True),
                          "value": [1.0, 2.0]})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert table.schema.field("conversion_time").type.unit == "ns"
    cut = pd.Timestamp((NS + 1_000_000_000) // 1000, unit="us", tz="UTC").to_pydatetime()
    train, test = split_table(table, cut)
    assert train.num_rows == 1 and test.num_rows == 1
