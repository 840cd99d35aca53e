"""Shared test data and helpers: the paper's worked example, parameter and log factories, job helpers.

Test modules import from here, never from each other.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import araopt.calibration as cb
from araopt.io.conversions import Conversions
from araopt.mechanism.params import Params, QueryParams
from araopt.version import ParameterVersion

SLICES = "campaign,geo"
"""The slice columns of the nightly histories."""
LOG_DAY = pd.Timestamp("2026-09-01", tz="UTC")
"""The day of ``log``'s conversions."""
RELEASE_DAY = pd.Timestamp("2026-11-20", tz="UTC")
"""The day of ``conversions``' conversions."""


# ---- from test_measure_pipeline.py ------------------------------------------------------------


def make_frame(n=4000, seed=0, impressions=700):
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, impressions, n).astype("int64")
    return pd.DataFrame({  # slices are impression features: one value per impression
        "impression_id": imp,
        "conversion_time": pd.to_datetime(rng.integers(0, 10**6, n), unit="s", utc=True),
        "campaign": (imp * 7 % 5).astype("int32"),
        "geo": np.array(["NY", "BOS", "SF"])[imp * 11 % 3],
        "value": rng.lognormal(2, 1, n),
        "items": rng.poisson(2, n).astype("int64"),
    })


def make_params(encoding="linf"):
    if encoding == "baseline":
        return Params(count_limit=3, encoding="baseline", epsilon=4.0, slice_columns=("campaign", "geo"),
                      queries=(QueryParams("value", 20.0, 0.4), QueryParams("items", 3.0, 0.3)), count_budget_fraction=0.3)
    return Params(count_limit=3, encoding="linf", epsilon=4.0, slice_columns=("campaign", "geo"),
                  queries=(QueryParams("value", 20.0, 0.6), QueryParams("items", 3.0, 0.4)))


def write_parts(frame, directory, parts):
    os.makedirs(directory, exist_ok=True)
    for i in range(parts):
        pq.write_table(pa.Table.from_pandas(frame.iloc[i::parts], preserve_index=False),
                       os.path.join(directory, f"part-{i}.parquet"))
    return str(directory)


# ---- from test_nightly.py ------------------------------------------------------------


def write_history(root, days=("2026-11-20", "2026-11-21", "2026-11-22"), n=3000, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    for i, day in enumerate(days):
        imp = rng.integers(0, n // 4, n) + i * 10**6
        frame = pd.DataFrame({
            "impression_id": imp.astype("int64"),
            "conversion_time": pd.Timestamp(day, tz="UTC") + pd.to_timedelta(rng.integers(0, 86400, n), unit="s"),
            "campaign": (imp % 4).astype("int32"),
            "geo": (imp % 3).astype("int32"),
            "value": rng.lognormal(2, 1, n) * scale,
        })
        os.makedirs(os.path.join(root, f"date={day}"), exist_ok=True)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False),
                       os.path.join(root, f"date={day}", "part-0.parquet"))
    return str(root)


def nightly_args(history, store, as_of="2026-11-22", window=3, epsilon=8, extra=()):
    return ["--history", history, "--as-of", as_of, "--window-days", str(window), "--store", store,
            "--slices", SLICES, "--values", "value", "--epsilon", str(epsilon), "--max-count-limit", "8", *extra]


# ---- from test_run_folder.py ------------------------------------------------------------


RACES = 20


def conversions_table(n=2000, seed=0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "impression_id": pa.array(rng.integers(0, 500, n), pa.int64()),
        "conversion_time": pa.array(1_795_132_800_000_000 + rng.integers(0, 10**11, n), pa.timestamp("us", tz="UTC")),
        "s": pa.array(rng.choice(["a", "b"], n)),
        "v": pa.array(rng.lognormal(2, 1, n)),
    })


# ---- from test_evaluation.py ------------------------------------------------------------


def small_d2(n: int = 1500, seed: int = 11) -> Conversions:
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, n // 3, n)
    frame = pd.DataFrame({"impression_id": imp,
                          "conversion_time": pd.to_datetime(rng.integers(0, 10**6, n), unit="s", utc=True),
                          "s": imp * 7 % 5, "items": rng.poisson(2.0, n).astype(float),
                          "price": rng.lognormal(2, 1, n)})
    return Conversions.from_table(frame, ["s"], ["items", "price"])


# ---- from test_inputs.py ------------------------------------------------------------


def log(n=400, seed=0, impressions=100):
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, impressions, n)
    return pd.DataFrame({"impression_id": imp.astype("int64"),
                         "conversion_time": LOG_DAY + pd.to_timedelta(rng.integers(0, 86400, n), unit="s"),
                         "s": np.array(["a", "b", "c"], dtype=object)[imp % 3], "v": rng.lognormal(2, 1, n)})


def write_log(tmp_path, frame=None, name="log.parquet"):
    path = tmp_path / name
    (log() if frame is None else frame).to_parquet(path)
    return str(path)


# ---- from test_hardening.py ------------------------------------------------------------


def conversions(n=600, seed=0, slices=("a", "b", "c"), impressions=150, start_id=0):
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, impressions, n) + start_id
    return pd.DataFrame({
        "impression_id": imp.astype("int64"),
        "conversion_time": RELEASE_DAY + pd.to_timedelta(rng.integers(0, 86400, n), unit="s"),
        "s": np.asarray(slices, dtype=object)[imp % len(slices)],
        "v": rng.lognormal(2, 1, n),
    })


def params(epsilon=8.0, count_limit=2):
    return Params(count_limit=count_limit, encoding="linf", epsilon=epsilon, slice_columns=("s",),
                  queries=(QueryParams("v", 20.0, 1.0),))


def write(frame, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


def domain_csv(tmp_path, values=("a", "b", "c")):
    path = tmp_path / "domain.csv"
    path.write_text("s\n" + "".join(f"{v}\n" for v in values))
    return str(path)


def setup(tmp_path, frame=None, p=None):
    data = tmp_path / "in"
    write(conversions() if frame is None else frame, str(data / "part-0.parquet"))
    ParameterVersion(p or params()).save(tmp_path / "p.json")
    return str(data), str(tmp_path / "p.json")


def error_line(err, prog="araopt measure"):
    assert "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]
    return line


def read_json(path):
    with open(path) as fh:
        return json.load(fh)


# ---- from test_calibration.py ------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def fitted() -> tuple[Params, cb.Calibration]:
    rng = np.random.default_rng(2)
    conv, days = generate(rng, [3.0, 5.0], [400, 400])
    params = linf(count_limit=3, clip=4.0)
    return params, cb.calibrate(conv, params, days)


def linf(count_limit: int = 2, clip: float = 10.0, epsilon: float = 8.0, slices=("s",)) -> Params:
    return Params(count_limit=count_limit, encoding="linf", epsilon=epsilon, slice_columns=slices,
                  queries=(QueryParams("value", clip, 1.0),))


def generate(rng: np.random.Generator, lams, impressions, id_offset: int = 0, days: int = 7,
             sigma: float = 1.0) -> tuple[Conversions, np.ndarray]:
    """Slices s = 0..k-1 with impressions[s] impressions, Poisson(lams[s]) conversions each (>= 1)."""
    ids, slices, days_of = [], [], []
    next_id = id_offset
    for s, (lam, n) in enumerate(zip(lams, impressions, strict=True)):
        sizes = 1 + rng.poisson(lam - 1.0, n)
        ids.append(np.repeat(np.arange(next_id, next_id + n), sizes))
        slices.append(np.full(sizes.sum(), s))
        days_of.append(np.repeat(rng.integers(0, days, n), sizes))
        next_id += n
    imp = np.concatenate(ids)
    n = len(imp)
    conv = Conversions(imp, rng.integers(0, 10**12, n), {"s": np.concatenate(slices)},
                       rng.lognormal(1.0, sigma, (n, 1)), ("value",))
    return conv, np.concatenate(days_of)


# ---- the paper's worked example (Sec. 4.1) and parameter versions ------------------------------------
def du_penc_params(**kw) -> Params:
    """Sec. 4.1 worked example: C = 2, C_1 = 2 items, C_2 = $30, alpha_1 = alpha_2 = 0.5, slices by campaign."""
    base = dict(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                queries=(QueryParams("items", 2.0, 0.5), QueryParams("value", 30.0, 0.5)))
    base.update(kw)
    return Params(**base)


def du_penc_frame() -> pd.DataFrame:
    """Sec. 4.1's conversions z1..z7 (impressions 123, 456, 789, 101; campaigns Thanksgiving, Christmas)."""
    return pd.DataFrame({
        "impression_id": [123, 123, 456, 123, 101, 789, 101],
        "conversion_time": pd.to_datetime([1, 2, 3, 4, 5, 6, 7], unit="h", utc=True),
        "campaign": ["Thanksgiving"] * 4 + ["Christmas"] * 3,
        "city": ["New York", "New York", "Boston", "New York", "Boston", "New York", "Boston"],
        "items": [3, 1, 1, 2, 2, 3, 1],
        "value": [21.0, 5, 99, 23, 50, 15, 5],
    })


def du_penc_conversions() -> Conversions:
    return Conversions.from_table(du_penc_frame(), ["campaign"], ["items", "value"])


def history_version(params: Params, slice_values, learnt_before=RELEASE_DAY) -> ParameterVersion:
    """``params`` as a parameter version carrying the domain of a history's slices (as optimize publishes),
    a history that ended at ``learnt_before`` (by default the day the factories' conversions are on)."""
    domain = dataclasses.replace(params.history_domain(slice_values),
                                 learnt_before_us=pd.Timestamp(learnt_before).value // 1000)
    return ParameterVersion(params, domain=domain)
