"""Specification of araopt.criteo on hand-made files in the exact Criteo Sponsored Search format.

The format is 23 tab-separated columns, no header, and -1 for missing values, in the order of
CRITEO_COLUMNS. The real data set cannot be downloaded. These files follow the format byte for
byte (hashed categorical values are 32-hex-digit strings).
"""
from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from araopt.data.criteo import CRITEO_COLUMNS, CRITEO_LOG_SCHEMA, REASONS, convert_criteo, read_criteo

T0 = 1_596_439_000  # 2020-08-03T07:16:40Z, Unix seconds like click_timestamp


def h(tag: str) -> str:
    """A 32-hex-digit hashed categorical value, as in the data set."""
    return (tag.encode().hex().upper() * 32)[:32]


def line(sale="1", amount="12.5", delay="3600", click=str(T0), nb_clicks="-1", price="10.0",
         partner=None, user=None, product=None, **cats: str) -> str:
    fields = {
        "Sale": sale, "SalesAmountInEuro": amount, "time_delay_for_conversion": delay, "click_timestamp": click,
        "nb_clicks_1week": nb_clicks, "product_price": price,
        "product_age_group": "-1", "device_type": h("dev"), "audience_id": "-1", "product_gender": "-1",
        "product_brand": h("brand"), **{f"product_category{i}": "-1" for i in range(1, 8)},
        "product_country": h("FR"), "product_id": product or h("prod"), "product_title": h("title") + " " + h("t2"),
        "partner_id": partner or h("partnerA"), "user_id": user or h("user1"),
    }
    fields.update(cats)
    assert list(fields) == list(CRITEO_COLUMNS)
    return "\t".join(fields.values())


ROWS = [
    line(),                                                                      # 1 converted
    line(sale="0", amount="-1", delay="-1", click=str(T0 + 60), price="-1"),     # 2 non-converting, price missing
    line(sale="1", amount="-1", delay="100", click=str(T0 + 120)),               # 3 dead: amount missing on a sale
    line(sale="1", amount="3.0", delay="100", click=str(T0 + 180), price="-1"),  # 4 dead: price missing on a sale
    line(sale="1", amount="3.0", delay="50", click=str(T0 + 240), partner="-1"),  # 5 dead: no slice
    line(sale="1", amount="4.0", delay="-1", click=str(T0 + 300)),               # 6 dead: no conversion time
    line(sale="2", amount="1", delay="1", click=str(T0 + 360)),                  # 7 dead: Sale not 0/1
    line(sale="1", amount="9.99", delay="0", click=str(T0 + 420), price="0", partner=h("partnerB"),
         user="-1", product="-1"),                                               # 8 converted, price 0, ids missing
    line(sale="0", amount="-1", delay="-1", click="-1"),                         # 9 non-converting, no click time
    line(sale="1", amount="", delay="5", click=str(T0 + 480)),                   # 10 dead: empty field
    line(sale="1", amount="inf", delay="5", click=str(T0 + 540)),                # 11 dead: not finite
]


def write(path: Path, lines: list[str], newline_at_end: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""))
    return path


def utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def test_hand_made_file_maps_to_the_contract(tmp_path: Path) -> None:
    load = read_criteo(write(tmp_path / "c.tsv", ROWS))
    t = load.table
    assert t.schema.equals(CRITEO_LOG_SCHEMA)
    assert t["impression_id"].to_pylist() == [1, 8]  # line numbers of the converted, valid rows
    assert t["conversion_time"].to_pylist() == [utc(T0 + 3600), utc(T0 + 420)]  # click + delay
    assert t["click_time"].to_pylist() == [utc(T0), utc(T0 + 420)]
    assert t["partner_id"].to_pylist() == [h("partnerA"), h("partnerB")]
    assert t["product_price_x_sale"].to_pylist() == [10.0, 0.0]
    assert t["SalesAmountInEuro"].to_pylist() == [12.5, 9.99]
    assert t["Sale"].to_pylist() == [1, 1]
    assert t["user_id"].to_pylist() == [h("user1"), None]  # -1 -> missing
    assert t["product_id"].to_pylist() == [h("prod"), None]
    dead = load.dead_letters.to_pydict()
    assert list(zip(dead["line"], dead["reason"], strict=True)) == [
        (3, "SalesAmountInEuro missing (-1) or invalid on a converted row"),
        (4, "product_price missing (-1) or invalid on a converted row"),
        (5, "partner_id missing (-1)"),
        (6, "time_delay_for_conversion missing (-1) on a converted row"),
        (7, "Sale must be 0 or 1"),
        (10, "empty field SalesAmountInEuro"),
        (11, "SalesAmountInEuro missing (-1) or invalid on a converted row"),
    ]
    assert set(dead["reason"]) <= set(REASONS)
    s = load.stats
    assert (s.lines, s.conversions, s.non_converting_dropped, s.non_converting_kept, s.dead_letters) == (11, 2, 2, 0, 7)


def test_non_converting_clicks_are_kept_on_request_with_zero_value(tmp_path: Path) -> None:
    load = read_criteo(write(tmp_path / "c.tsv", ROWS), include_non_converting=True)
    t = load.table.to_pydict()
    assert t["impression_id"] == [1, 2, 8]
    row = {k: v[1] for k, v in t.items()}
    assert row["Sale"] == 0 and row["product_price_x_sale"] == 0.0 and row["SalesAmountInEuro"] == 0.0
    assert row["conversion_time"] == row["click_time"] == utc(T0 + 60)  # no sale: the click time
    assert row["product_price"] is None  # -1 -> missing, yet the value is 0 because Sale = 0
    dead = dict(zip(load.dead_letters["line"].to_pylist(), load.dead_letters["reason"].to_pylist(), strict=True))
    assert dead[9] == "click_timestamp missing (-1) or negative"  # kept rows need a time


def test_contradictory_non_converting_row_goes_to_dead_letters(tmp_path: Path) -> None:
    path = write(tmp_path / "c.tsv", [line(sale="0", amount="5.5", delay="-1")])
    assert read_criteo(path).table.num_rows == 0  # dropped as non-converting by default
    load = read_criteo(path, include_non_converting=True)
    assert load.dead_letters["reason"].to_pylist() == ["SalesAmountInEuro > 0 on a non-converting row"]


@pytest.mark.parametrize("bad,found", [("1\t2\t3", 3), (line() + "\textra", 24), ("", 1)])
def test_wrong_number_of_columns_names_the_line(tmp_path: Path, bad: str, found: int) -> None:
    rows = ROWS[:3] + [bad] + ROWS[3:]
    with pytest.raises(ValueError, match=rf"line 4: expected 23 tab-separated columns, found {found}"):
        read_criteo(write(tmp_path / "c.tsv", rows))


def test_line_numbers_are_exact_across_read_blocks(tmp_path: Path) -> None:
    good = [line(click=str(T0 + i)) for i in range(3000)]
    path = write(tmp_path / "big.tsv", good[:2500] + [line(sale="1", amount="-1")] + good[2500:])
    load = read_criteo(path)
    assert load.dead_letters["line"].to_pylist() == [2501]
    ids = load.table["impression_id"].to_pylist()
    assert ids == list(range(1, 2501)) + list(range(2502, 3002))
    bad = write(tmp_path / "bad.tsv", good[:2800] + ["1\t2"] + good[2800:])
    from araopt.data import criteo
    with pytest.raises(ValueError, match="line 2801: expected 23"):
        list(criteo.iter_criteo(bad, block_size=4096))  # many small blocks


def test_non_numeric_value_names_line_and_column(tmp_path: Path) -> None:
    rows = ROWS[:5] + [line(amount="12,5")] + ROWS[5:]
    with pytest.raises(ValueError, match=r"line 6: column SalesAmountInEuro: .*'12,5'"):
        read_criteo(write(tmp_path / "c.tsv", rows))


def test_gzip_input_and_missing_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "c.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(ROWS))
    assert read_criteo(path).table["impression_id"].to_pylist() == [1, 8]


def test_convert_writes_log_dead_letters_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "criteo"
    stats = convert_criteo(write(tmp_path / "c.tsv", ROWS), out)
    log = ds.dataset(out, format="parquet").to_table()  # _dead_letters / _manifest are skipped
    assert log.schema.equals(CRITEO_LOG_SCHEMA) and log["impression_id"].to_pylist() == [1, 8]
    dead = ds.dataset(sorted(out.glob("_dead_letters-*.parquet"))).to_table()
    assert dead.num_rows == 7 == stats.dead_letters
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["conversions"] == 2 and manifest["lines"] == 11
    with pytest.raises(ValueError, match="already holds data"):
        convert_criteo(tmp_path / "c.tsv", out)
    convert_criteo(tmp_path / "c.tsv", out, overwrite=True, include_non_converting=True)
    assert ds.dataset(out, format="parquet").count_rows() == 3
    with pytest.raises(ValueError, match="line 2"):  # a failed overwrite keeps the previous output
        convert_criteo(write(tmp_path / "bad.tsv", [ROWS[0], "1\t2"]), out, overwrite=True)
    assert ds.dataset(out, format="parquet").count_rows() == 3
    # nothing staged is left; the lock file stays beside the output (araopt.io.locks.FileLock)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".criteo.araopt-lock", "bad.tsv", "c.tsv", "criteo"]


def test_convert_publishes_nothing_for_a_malformed_file(tmp_path: Path) -> None:
    out = tmp_path / "criteo"
    with pytest.raises(ValueError, match="line 2"):
        convert_criteo(write(tmp_path / "c.tsv", [ROWS[0], "x\ty"]), out)
    assert not out.exists() and [p.name for p in tmp_path.glob("*criteo*")] == [".criteo.araopt-lock"]
    with pytest.raises(ValueError, match="does not exist"):
        read_criteo(tmp_path / "missing.tsv")


def test_empty_file_gives_an_empty_log(tmp_path: Path) -> None:
    load = read_criteo(write(tmp_path / "e.tsv", [], newline_at_end=False))
    assert load.table.num_rows == 0 and load.table.schema.equals(CRITEO_LOG_SCHEMA)
    assert isinstance(load.dead_letters, pa.Table)
