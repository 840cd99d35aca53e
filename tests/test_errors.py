"""Every refusal is a ValueError of one of araopt's kinds (araopt.errors), raised where it is decided: one
representative site per layer and kind, so a caller can tell bad parameters from bad data, a privacy
refusal, an unsupported combination and a refused output."""
from __future__ import annotations

import numpy as np
import pytest

from araopt import Conversions, encode
from araopt.ara.registrations import AraLimitError
from araopt.errors import (
    AraoptError,
    InvalidInput,
    InvalidParameters,
    OutputRefused,
    PrivacyRefusal,
    Unsupported,
)
from araopt.io import jsonio
from araopt.io.conversions import ValidationCounts, check_rejected_share
from araopt.io.locks import LockHeld
from araopt.io.store import StoreConflict, StoreError
from araopt.ledger.ledger import LedgerRefusal
from araopt.mechanism.aggregate import TooManySlices
from araopt.mechanism.bounding import contribution_norms
from araopt.mechanism.keys import KeyDomain, bucket_from_bytes
from araopt.mechanism.measure import measure
from araopt.mechanism.noise import noise_parameter
from araopt.optimize.statistics import StatisticsSpec
from factories import conversions, params
from pipelines.values import split_columns


def test_the_kinds_are_value_errors():
    for kind in (InvalidParameters, InvalidInput, PrivacyRefusal, Unsupported, OutputRefused, AraLimitError,
                 jsonio.DuplicateKeyError, StoreError, StoreConflict, LockHeld, TooManySlices, LedgerRefusal):
        assert issubclass(kind, AraoptError) and issubclass(kind, ValueError)
    assert issubclass(AraLimitError, InvalidParameters) and issubclass(jsonio.DuplicateKeyError, InvalidInput)


def test_every_refusal_is_one_of_the_kinds():
    """One taxonomy: the store's, the locks' and the ledger's refusals are kinds (or the store's own)."""
    assert issubclass(StoreConflict, OutputRefused) and issubclass(LockHeld, OutputRefused)
    assert issubclass(TooManySlices, InvalidInput) and issubclass(LedgerRefusal, PrivacyRefusal)


def test_bad_data_is_invalid_input():
    p = params()
    with pytest.raises(InvalidInput, match="finite"):
        encode(np.array([[np.nan]]), p, np.random.default_rng(0))
    with pytest.raises(InvalidInput, match="non-negative integers"):
        contribution_norms(np.array([-1]), 10)
    with pytest.raises(InvalidInput, match="at most 16"):
        bucket_from_bytes(b"\x01" * 17)
    with pytest.raises(InvalidInput, match="appears twice"):
        jsonio.loads(b'{"a": 1, "a": 2}', "test")
    with pytest.raises(InvalidInput, match="no conversion rows"):
        check_rejected_share(ValidationCounts(rows_read=0))


def test_bad_parameters_are_invalid_parameters():
    with pytest.raises(InvalidParameters, match="uniforms"):
        encode(np.array([[1.0]]), params(), uniforms=np.array([[1.5]]))
    with pytest.raises(InvalidParameters, match="distinct"):
        StatisticsSpec(("a",), ("a",))
    with pytest.raises(InvalidParameters, match="max_rejected_fraction"):
        check_rejected_share(ValidationCounts(rows_read=1), 2.0)
    with pytest.raises(InvalidParameters, match="twice"):
        split_columns("a,a", "--slices")
    with pytest.raises(InvalidParameters, match="positive integer"):
        noise_parameter(1.0, 0)


def test_privacy_refusals():
    frame = conversions()
    conv = Conversions.from_table(frame, ("s",), ("v",))
    with pytest.raises(PrivacyRefusal, match="declared key domain"):
        measure(conv, params())  # a release whose domain would come from the data it releases
    with pytest.raises(PrivacyRefusal, match="above the 10% threshold"):
        check_rejected_share(ValidationCounts(rows_read=10, rows_rejected=2, rejected_by_reason={"x": 2}))


def test_unsupported():
    big = {f"c{i}": np.arange(2**13) for i in range(5)}  # 2^65 slices: no dense index
    with pytest.raises(Unsupported, match="too large for dense indexing"):
        KeyDomain.from_slice_values(tuple(big), big, ("v",)).slice_index({c: v[:1] for c, v in big.items()})
