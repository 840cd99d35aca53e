"""Key layout: slice fields and the query code in a 128-bit bucket; the domain; the key map."""
import numpy as np
import pandas as pd
import pytest

from araopt.mechanism import keys
from araopt.mechanism.keys import KeyDomain, bucket_from_bytes, bucket_to_bytes


def domain():
    cols = {"campaign": np.array(["Xmas", "Thanks", "Xmas"]), "city": np.array([3, 1, 1])}
    return KeyDomain.from_slice_values(("campaign", "city"), cols, ("items", "value"), conversion_slice_columns=("city",))


def test_layout_bits_and_buckets():
    d = domain()
    assert d.dictionaries == (("Thanks", "Xmas"), (1, 3))
    assert d.field_bits == (1, 1) and d.field_offsets == (9, 8) and d.total_bits == 10
    assert d.slices.tolist() == [[0, 0], [1, 0], [1, 1]]
    # slice (Xmas, 3) = indices (1, 1): campaign bit 9, city bit 8; query codes: items 1, value 2, bottom 0
    assert d.bucket(2, 0) == (1 << 9) | (1 << 8) | 1
    assert d.bucket(2, 2) == (1 << 9) | (1 << 8)
    assert len(set(d.buckets())) == d.num_keys == 9
    # the source piece (impression columns) OR the trigger piece (conversion columns + query) is the bucket
    row = d.slices[2]
    assert d.slice_bits(row, ["campaign"]) | d.slice_bits(row, ["city"]) | d.query_code(1) == d.bucket(2, 1)


def test_slice_index_marks_records_outside_the_domain():
    d = domain()
    idx = d.slice_index({"campaign": np.array(["Xmas", "Thanks", "Other", "Thanks"]), "city": np.array([3, 1, 1, 3])})
    assert idx.tolist() == [2, 0, -1, -1]


def test_key_map_round_trip_and_tamper_detection(tmp_path):
    d = domain()
    d.save(tmp_path / "k.json", params_sha256="ab" * 32)
    assert KeyDomain.load(tmp_path / "k.json") == d
    text = (tmp_path / "k.json").read_text().replace('"Xmas"', '"Easter"')
    (tmp_path / "k.json").write_text(text)
    with pytest.raises(ValueError, match="checksum"):
        KeyDomain.load(tmp_path / "k.json")
    table = d.key_table()
    assert list(table.columns) == ["campaign", "city", "query", "bucket", "key_id"]
    assert table["query"].tolist()[:3] == ["items", "value", "bottom"]


def test_too_many_bits_refused_with_excess():
    # 61 columns of 4 values need 2 bits each: 122 + 8 query bits = 130 > 128
    dicts = tuple(tuple(range(4)) for _ in range(61))
    with pytest.raises(ValueError, match=r"130 > 128 \(exceeds by 2\)"):
        KeyDomain(tuple(f"c{i}" for i in range(61)), dicts, np.zeros((0, 61)), ("v",))
    KeyDomain(tuple(f"c{i}" for i in range(60)), dicts[:60], np.zeros((0, 60)), ("v",))  # 128 bits: fits


def test_bucket_bytes_with_leading_zeros_dropped():
    b = (1 << 9) | 5
    assert bucket_to_bytes(b) == b"\x00" * 14 + b"\x02\x05"
    assert bucket_from_bytes(b"\x02\x05") == b == bucket_from_bytes(bucket_to_bytes(b))
    with pytest.raises(ValueError):
        bucket_from_bytes(b"\x01" * 17)


def test_slice_index_of_categorical_columns_equals_that_of_their_values():
    d = domain()
    values = np.array(["Xmas", "Thanks", "Other", "Thanks", "Xmas"], dtype=object)
    cities = np.array([3, 1, 1, 3, 1])
    want = d.slice_index({"campaign": values, "city": cities})
    assert want.tolist() == [2, 0, -1, -1, 1]
    categorical = pd.Categorical(values, categories=["Other", "Xmas", "Thanks", "Unused"])
    assert d.slice_index({"campaign": categorical, "city": cities}).tolist() == want.tolist()
    missing = pd.Categorical(["Xmas", None], categories=["Xmas"])  # code -1 is outside the domain
    assert d.slice_index({"campaign": missing, "city": np.array([1, 1])}).tolist() == [1, -1]


def test_slice_index_by_lookup_table_and_by_search_agree(monkeypatch):
    rng = np.random.default_rng(3)
    columns = {"a": rng.integers(0, 300, 5000), "b": rng.integers(0, 200, 5000), "c": rng.integers(0, 40, 5000)}
    d = KeyDomain.from_slice_values(("a", "b", "c"), {k: v[:3000] for k, v in columns.items()}, ("value",))
    assert 300 * 200 * 40 > keys._LOOKUP_TABLE_MAX  # this space is searched ...
    searched = d.slice_index(columns)
    monkeypatch.setattr(keys, "_LOOKUP_TABLE_MAX", 1 << 30)  # ... and here looked up in a table
    assert np.array_equal(d.slice_index(columns), searched)
    assert (searched[:3000] >= 0).all() and (searched[3000:] == -1).any()
    assert np.array_equal(d.slices[searched[:3000]], d.dictionary_indices({k: v[:3000] for k, v in columns.items()})[0])


@pytest.mark.parametrize("table_max", [None, 4])
def test_slice_index_of_all_categorical_columns_by_their_codes_is_that_of_their_values(monkeypatch, table_max):
    """Every slice column categorical (how the Beam steps read them): one table over the categories'
    combinations; the same indices as the values' (missing values, unused categories and values
    outside the domain included), and the same by the per-column lookup when the table would be too big."""
    if table_max is not None:
        monkeypatch.setattr(keys, "_LOOKUP_TABLE_MAX", table_max)
    rng = np.random.default_rng(4)
    d = KeyDomain.from_slice_values(("a", "b"), {"a": np.array(["x", "y", "z", "x"], dtype=object),
                                                 "b": np.array(["u", "v", "v", "w"], dtype=object)}, ("value",))
    a = np.array(["x", "y", "z", "q", None], dtype=object)[rng.integers(0, 5, 400)]
    b = np.array(["u", "v", "w", "é", None], dtype=object)[rng.integers(0, 5, 400)]
    want = d.slice_index({"a": a, "b": b})
    assert (want >= 0).any() and (want < 0).any()
    got = d.slice_index({"a": pd.Categorical(a, categories=["q", "z", "x", "y", "unused"]),
                         "b": pd.Categorical(b)})
    assert got.tolist() == want.tolist()
