"""Parameter store: publish/resolve, idempotency, races, corruption and crashes.

Every behavioural test runs against the local store and against GcsStore on a real fake-gcs-server
(which honours generation preconditions, unlike gcp-storage-emulator).
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt.io import local_store as local_store_module
from araopt.io.gcs_store import GcsStore
from araopt.io.local_store import LocalStore
from araopt.io.store import LATEST, LatestPointer, ParameterStore, StoreConflict, StoreError
from araopt.io.stores import open_store, parse_params_ref, resolve_params_ref
from gcs_fixtures import EmulatorHandle, fake_gcs_server, gcp_storage_emulator  # noqa: F401 - fixtures

BASE_AS_OF = "2024-03-01"


def payload(tag: str, n: int = 0) -> bytes:
    """A small params-like JSON document, distinct per (tag, n)."""
    return json.dumps({"tag": tag, "n": n, "thresholds": [1, 2, 3], "count_limit": 4}, sort_keys=True).encode()


def params_key(version: str) -> str:
    return f"versions/{version}/params.json"


def checksum_key(version: str) -> str:
    return f"versions/{version}/params.json.sha256"


def assert_one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, f"not a one-line message: {text!r}"
    return text


@dataclass
class Backend:
    """One store under test plus raw access to its objects (to corrupt them)."""

    kind: str
    uri: str
    server: EmulatorHandle | None = None
    opened: list[ParameterStore] = field(default_factory=list)

    def open(self, retry_deadline: float = 10.0) -> ParameterStore:
        store = open_store(self.uri, gcs_retry_deadline=retry_deadline, gcs_timeout=10.0)
        self.opened.append(store)
        return store

    def object_uri(self, key: str) -> str:
        return f"{self.uri}/{key}"

    def write_raw(self, key: str, data: bytes) -> None:
        if self.server is None:
            path = Path(self.uri) / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            path.write_bytes(data)
        else:
            prefix = self.uri.split("/", 3)[3]
            self.server.client().bucket(self.server.bucket).blob(f"{prefix}/{key}").upload_from_string(data)

    def read_raw(self, key: str) -> bytes | None:
        if self.server is None:
            path = Path(self.uri) / key
            return path.read_bytes() if path.exists() else None
        prefix = self.uri.split("/", 3)[3]
        blob = self.server.client().bucket(self.server.bucket).get_blob(f"{prefix}/{key}")
        return None if blob is None else blob.download_as_bytes()

    def delete_raw(self, key: str) -> None:
        if self.server is None:
            (Path(self.uri) / key).unlink()
        else:
            prefix = self.uri.split("/", 3)[3]
            self.server.client().bucket(self.server.bucket).blob(f"{prefix}/{key}").delete()


@pytest.fixture(params=["local", "gcs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        yield Backend("local", str(tmp_path / "store"))
    else:
        server: EmulatorHandle = request.getfixturevalue("fake_gcs_server")
        yield Backend("gcs", server.store_uri("nightly/params"), server)


@pytest.fixture
def published(backend: Backend) -> tuple[Backend, ParameterStore, str]:
    """A store with one published version (the base that must survive failures)."""
    store = backend.open()
    result = store.publish(BASE_AS_OF, "base", payload("base"))
    return backend, store, result.version


# ---------------------------------------------------------------------------------------------
# Round trip and idempotency
# ---------------------------------------------------------------------------------------------


def test_publish_resolve_round_trip(backend: Backend) -> None:
    store = backend.open()
    assert store.read_latest_pointer() is None
    assert store.list_versions() == []

    first = store.publish("2024-03-01", "run1", payload("a"))
    assert (first.version, first.created, first.moved) == ("2024-03-01-run1", True, True)
    assert first.uri == backend.object_uri(params_key("2024-03-01-run1"))
    pointer = store.read_latest_pointer()
    assert pointer == first.pointer
    assert (pointer.previous, pointer.serial, pointer.as_of, pointer.run_id) == (None, 1, "2024-03-01", "run1")

    resolved = store.resolve()
    assert resolved.payload == payload("a")
    assert resolved.version == "2024-03-01-run1"
    assert resolved.sha256 == first.sha256
    assert resolved.uri == first.uri
    assert resolved.summary()["version"] == "2024-03-01-run1"
    assert resolved.summary()["store"] == store.uri

    second = store.publish("2024-03-02", "run1", payload("b"))
    assert second.pointer.previous == "2024-03-01-run1"
    assert second.pointer.serial == 2
    assert store.resolve().payload == payload("b")
    assert store.resolve("2024-03-01-run1").payload == payload("a")  # old versions stay readable
    assert store.list_versions() == ["2024-03-01-run1", "2024-03-02-run1"]
    # The checksum file is sha256sum-compatible.
    assert backend.read_raw(checksum_key("2024-03-02-run1")) == f"{second.sha256}  params.json\n".encode()


def test_republishing_same_as_of_is_idempotent(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, store, base = published
    pointer_bytes = backend.read_raw(LATEST)

    again = store.publish(BASE_AS_OF, "base", payload("base"))
    assert (again.version, again.created, again.moved) == (base, False, False)
    # A re-run with a new run id but the same result is also a no-op returning the existing version.
    rerun = store.publish(BASE_AS_OF, "rerun", payload("base"))
    assert (rerun.version, rerun.moved) == (base, False)
    assert backend.read_raw(LATEST) == pointer_bytes  # not even rewritten
    assert store.list_versions() == [base]

    # The same version name with different bytes is refused: versions are immutable.
    with pytest.raises(StoreError, match="already exists with different content") as info:
        store.publish(BASE_AS_OF, "base", payload("different"))
    assert backend.object_uri(params_key(base)) in assert_one_line(info.value)
    assert store.resolve().payload == payload("base")

    # Late data for the same as-of (a different payload under a new run id) is a new version.
    late = store.publish(BASE_AS_OF, "late", payload("late"))
    assert late.moved and late.pointer.previous == base
    assert store.resolve().version == f"{BASE_AS_OF}-late"


def test_publish_completes_a_version_written_before_a_crash(published: tuple[Backend, ParameterStore, str]) -> None:
    """A re-run after a crash between version write and pointer move finishes the publish."""
    backend, store, base = published
    backend.write_raw(params_key("2024-03-02-r1"), payload("next"))  # as the crashed run left it
    result = store.publish("2024-03-02", "r1", payload("next"))
    assert (result.created, result.moved) == (False, True)
    assert store.resolve().version == "2024-03-02-r1"
    assert store.resolve("2024-03-02-r1").payload == payload("next")


def test_rollback_to_older_as_of_needs_explicit_flag(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, store, base = published
    with pytest.raises(StoreError, match="refusing to move") as info:
        store.publish("2024-02-01", "old", payload("old"))
    assert_one_line(info.value)
    assert store.list_versions() == [base]  # nothing written
    result = store.publish("2024-02-01", "old", payload("old"), allow_rollback=True)
    assert result.moved and store.resolve().version == "2024-02-01-old"


def test_expected_previous_guards_against_stale_jobs(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, store, base = published
    with pytest.raises(StoreConflict, match="another publisher moved it"):
        store.publish("2024-03-02", "stale", payload("stale"), expected_previous=None)
    with pytest.raises(StoreConflict):
        store.publish("2024-03-02", "stale", payload("stale"), expected_previous="2024-01-01-other")
    assert store.list_versions() == [base]  # refused before writing anything
    ok = store.publish("2024-03-02", "fresh", payload("fresh"), expected_previous=base)
    assert ok.moved
    # A retry of the same job after it succeeded is a no-op, even though latest is no longer `base`.
    again = store.publish("2024-03-02", "fresh", payload("fresh"), expected_previous=base)
    assert (again.version, again.moved) == ("2024-03-02-fresh", False)


def test_publish_validates_arguments_before_writing(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    for as_of, run_id, data in [
        ("2024-3-1", "r", b"{}"),
        ("2024-02-30", "r", b"{}"),
        ("2024-03-01", "a/b", b"{}"),
        ("2024-03-01", "", b"{}"),
        ("2024-03-01", "r\n", b"{}"),
        ("2024-03-01\n", "r", b"{}"),
        ("2024-03-01", "r", b'{"truncated": '),
        ("2024-03-01", "r", b"\xff\xfe"),
    ]:
        with pytest.raises(ValueError):
            store.publish(as_of, run_id, data)
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# Races
# ---------------------------------------------------------------------------------------------


def _synchronize_swap(store: ParameterStore, barrier: threading.Barrier) -> None:
    """Make ``store`` wait at ``barrier`` right before its compare-and-swap of ``latest``."""
    original = store._swap_pointer

    def synced(data: bytes, expected_generation: int) -> None:
        barrier.wait(timeout=20)
        original(data, expected_generation)

    store._swap_pointer = synced  # type: ignore[method-assign]


class _Reader(threading.Thread):
    """Polls resolve() until stopped; every read must be a complete, checksum-valid version."""

    def __init__(self, store: ParameterStore) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.stop = threading.Event()
        self.seen: dict[str, bytes] = {}
        self.reads = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                resolved = self.store.resolve()
            except Exception as exc:  # noqa: BLE001 - any failure is a finding
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            json.loads(resolved.payload)
            self.seen.setdefault(resolved.version, resolved.payload)
            self.reads += 1
            self.stop.wait(0.001)  # poll hard, but leave the publishers some CPU


def test_two_racing_publishers_exactly_one_wins(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, _, base = published
    barrier = threading.Barrier(2)
    stores = [backend.open(), backend.open()]
    for store in stores:
        _synchronize_swap(store, barrier)
    reader = _Reader(backend.open())
    reader.start()
    outcomes: dict[str, object] = {}

    def job(index: int) -> None:
        try:
            outcomes[f"job{index}"] = stores[index].publish("2024-03-02", f"job{index}", payload("race", index))
        except Exception as exc:  # noqa: BLE001 - recorded and asserted below
            outcomes[f"job{index}"] = exc

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    time.sleep(0.05)
    reader.stop.set()
    reader.join(timeout=10)

    winners = [name for name, outcome in outcomes.items() if not isinstance(outcome, BaseException)]
    losers = {name: outcome for name, outcome in outcomes.items() if isinstance(outcome, BaseException)}
    assert len(winners) == 1, outcomes
    assert len(losers) == 1 and all(isinstance(exc, StoreConflict) for exc in losers.values()), outcomes
    winner_version = f"2024-03-02-{winners[0]}"
    (loser_name, loser_exc), = losers.items()
    message = assert_one_line(loser_exc)
    assert backend.object_uri(LATEST) in message and winner_version in message

    pointer = backend.open().read_latest_pointer()
    assert pointer is not None
    assert (pointer.version, pointer.previous, pointer.serial) == (winner_version, base, 2)
    # The loser's version is complete and readable by name, but it is not latest.
    loser_version = f"2024-03-02-{loser_name}"
    assert backend.open().resolve(loser_version).payload == payload("race", int(loser_name[-1]))
    assert not reader.errors, reader.errors[:3]
    assert reader.reads > 0
    assert set(reader.seen) <= {base, winner_version}
    assert reader.seen[base] == payload("base")


def test_lost_response_after_successful_pointer_move_is_not_a_conflict(
    published: tuple[Backend, ParameterStore, str],
) -> None:
    """A retried CAS whose first attempt landed sees a failed precondition; publish must still succeed."""
    backend, store, base = published
    original = store._swap_pointer

    def succeed_then_report_conflict(data: bytes, expected_generation: int) -> None:
        original(data, expected_generation)
        raise StoreConflict("simulated: response lost, retry got HTTP 412")

    store._swap_pointer = succeed_then_report_conflict  # type: ignore[method-assign]
    result = store.publish("2024-03-02", "r", payload("r"))
    assert result.moved and store.resolve().version == "2024-03-02-r"

    # But a real conflict (someone else's pointer) is still reported.
    other = backend.open()

    def lose(data: bytes, expected_generation: int) -> None:
        other.publish("2024-03-03", "other", payload("other"))
        original(data, expected_generation)

    store._swap_pointer = lose  # type: ignore[method-assign]
    with pytest.raises(StoreConflict, match="2024-03-03-other"):
        store.publish("2024-03-03", "mine", payload("mine"))


def _race_worker(
    uri: str, name: str, rounds: int, barrier: threading.Barrier, results: multiprocessing.Queue
) -> None:
    """Child process: publish once per round, all children CAS simultaneously (spawned)."""
    store = open_store(uri, gcs_retry_deadline=20.0)
    _synchronize_swap(store, barrier)
    for round_index in range(rounds):
        as_of = f"2024-04-{round_index + 1:02d}"
        try:
            store.publish(as_of, name, payload(name, round_index))
            outcome = "won"
        except StoreConflict:
            outcome = "lost"
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            outcome = f"error {type(exc).__name__}: {exc}"
        results.put((round_index, name, outcome))
        barrier.wait(timeout=20)  # every CAS of this round is done before the next round reads


@pytest.mark.slow
def test_racing_processes_every_round_has_exactly_one_winner(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, _, base = published
    workers, rounds = 3, 4
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(target=_race_worker, args=(backend.uri, f"p{i}", rounds, barrier, results))
        for i in range(workers)
    ]
    reader = _Reader(backend.open())
    reader.start()
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=90) for _ in range(workers * rounds)]
    for process in processes:
        process.join(timeout=30)
    reader.stop.set()
    reader.join(timeout=10)

    assert [process.exitcode for process in processes] == [0] * workers
    errors = [outcome for outcome in outcomes if outcome[2] not in ("won", "lost")]
    assert not errors, errors
    for round_index in range(rounds):
        round_outcomes = sorted(o[2] for o in outcomes if o[0] == round_index)
        assert round_outcomes == ["lost"] * (workers - 1) + ["won"], (round_index, outcomes)
    pointer = backend.open().read_latest_pointer()
    assert pointer is not None
    assert pointer.serial == 1 + rounds  # no lost update: one move per round
    assert pointer.as_of == f"2024-04-{rounds:02d}"
    assert len(backend.open().list_versions()) == 1 + workers * rounds
    assert not reader.errors, reader.errors[:3]
    assert reader.reads > 0
    attempted = {base} | {f"2024-04-{r + 1:02d}-p{i}" for r in range(rounds) for i in range(workers)}
    assert set(reader.seen) <= attempted


# ---------------------------------------------------------------------------------------------
# Corruption
# ---------------------------------------------------------------------------------------------

_GOOD_POINTER = LatestPointer(
    version=f"{BASE_AS_OF}-base",
    path=params_key(f"{BASE_AS_OF}-base"),
    sha256="0" * 64,
    as_of=BASE_AS_OF,
    run_id="base",
    published_at="2024-03-01T00:00:00+00:00",
    previous=None,
    serial=1,
)


def _pointer_with(**changes: object) -> bytes:
    body = json.loads(_GOOD_POINTER.to_json_bytes())
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v != "<drop>"}).encode()


@pytest.mark.parametrize(
    ("corruption", "expected"),
    [
        ("truncated", "not valid JSON"),
        ("empty", "not valid JSON"),
        ("list", "not a JSON object"),
        ("missing_field", "missing field"),
        ("bad_sha", "sha256"),
        ("path_escape", "path"),
        ("version_mismatch", "do not match"),
    ],
)
def test_corrupt_pointer_is_refused_naming_the_file(
    published: tuple[Backend, ParameterStore, str], corruption: str, expected: str
) -> None:
    backend, store, base = published
    good = backend.read_raw(LATEST)
    assert good is not None
    body = {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "list": b"[]",
        "missing_field": _pointer_with(sha256="<drop>"),
        "bad_sha": _pointer_with(sha256="xyz"),
        "path_escape": _pointer_with(path="../../etc/passwd"),
        "version_mismatch": _pointer_with(run_id="other"),
    }[corruption]
    backend.write_raw(LATEST, body)
    for action in (store.resolve, store.read_latest_pointer, lambda: store.publish("2024-03-02", "x", payload("x"))):
        with pytest.raises(StoreError, match=expected) as info:
            action()
        message = assert_one_line(info.value)
        assert backend.object_uri(LATEST) in message and "corrupt latest pointer" in message
    assert store.list_versions() == [base]  # publish refused before writing


@pytest.mark.parametrize("damage", ["truncated", "replaced", "missing"])
def test_corrupt_params_file_is_refused_naming_the_file(
    published: tuple[Backend, ParameterStore, str], damage: str
) -> None:
    backend, store, base = published
    key = params_key(base)
    good = backend.read_raw(key)
    assert good is not None
    if damage == "truncated":
        backend.write_raw(key, good[:-7])
    elif damage == "replaced":
        backend.write_raw(key, payload("evil"))
    else:
        backend.delete_raw(key)
    for ref in (LATEST, base):
        with pytest.raises(StoreError, match="checksum mismatch|missing") as info:
            store.resolve(ref)
        assert backend.object_uri(key) in assert_one_line(info.value)


def test_corrupt_or_missing_checksum_file_for_named_version(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, store, base = published
    backend.write_raw(checksum_key(base), b"not a checksum\n")
    with pytest.raises(StoreError, match="corrupt checksum file") as info:
        store.resolve(base)
    assert backend.object_uri(checksum_key(base)) in assert_one_line(info.value)
    assert store.resolve().version == base  # latest is verified against the pointer's checksum
    backend.delete_raw(checksum_key(base))
    with pytest.raises(StoreError, match="missing"):
        store.resolve(base)
    with pytest.raises(StoreError, match="not found"):
        store.resolve("2020-01-01-nope")
    with pytest.raises(StoreError, match="invalid version name"):
        store.resolve("../latest")


def test_resolve_on_empty_store_says_nothing_published(backend: Backend) -> None:
    with pytest.raises(StoreError, match="nothing published yet") as info:
        backend.open().resolve()
    assert backend.object_uri(LATEST) in assert_one_line(info.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
    st.sampled_from(["version", "path", "sha256", "as_of", "run_id", "published_at", "previous", "serial"]),
    st.one_of(st.none(), st.integers(), st.text(max_size=20), st.booleans()),
))))
def test_pointer_parser_only_raises_store_error(data: bytes) -> None:
    try:
        pointer = LatestPointer.from_json_bytes(data, "mem://latest")
    except StoreError as exc:
        assert "mem://latest" in assert_one_line(exc)
    else:
        assert LatestPointer.from_json_bytes(pointer.to_json_bytes(), "mem://latest") == pointer


# ---------------------------------------------------------------------------------------------
# Crashes mid-publish
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["_create", "_swap_pointer"])
def test_emulator_killed_mid_publish_keeps_previous_latest(
    fake_gcs_server: EmulatorHandle, hook: str  # noqa: F811 - fixture
) -> None:
    uri = fake_gcs_server.store_uri("crash")
    store = open_store(uri, gcs_retry_deadline=1.0, gcs_timeout=2.0)
    base = store.publish(BASE_AS_OF, "base", payload("base")).version
    original: Callable[..., object] = getattr(store, hook)

    def kill_then_call(*args: object) -> object:
        fake_gcs_server.kill()
        return original(*args)

    setattr(store, hook, kill_then_call)
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.publish("2024-03-02", "next", payload("next"))
    assert not isinstance(info.value, StoreConflict)
    message = assert_one_line(info.value)
    assert uri in message and "cannot" in message
    assert time.monotonic() - started < 20

    fake_gcs_server.restart()  # same port, same data directory
    fresh = open_store(uri, gcs_retry_deadline=5.0)
    resolved = fresh.resolve()
    assert (resolved.version, resolved.payload) == (base, payload("base"))
    # Re-running the failed job completes the publish.
    assert fresh.publish("2024-03-02", "next", payload("next")).moved
    assert fresh.resolve().version == "2024-03-02-next"


def test_emulator_down_before_publish_fails_before_any_work(fake_gcs_server: EmulatorHandle) -> None:  # noqa: F811
    store = open_store(fake_gcs_server.store_uri("down"), gcs_retry_deadline=0.5, gcs_timeout=1.0)
    fake_gcs_server.kill()
    with pytest.raises(StoreError, match="cannot read .*/down/latest") as info:
        store.publish(BASE_AS_OF, "x", payload("x"))
    assert_one_line(info.value)


def _crash_in_pointer_replace(root: str) -> None:
    """Child process: die (SIGKILL-like, no cleanup) while holding the lock, before os.replace."""

    def die(*_args: object, **_kwargs: object) -> None:
        os._exit(3)

    local_store_module.os.replace = die  # type: ignore[assignment] - this process only
    LocalStore(root).publish("2024-03-02", "crash", payload("crash"))
    os._exit(0)


@pytest.fixture
def local_published(tmp_path: Path) -> tuple[Backend, ParameterStore, str]:
    """A local store with one published version (for local-only failure tests)."""
    backend = Backend("local", str(tmp_path / "store"))
    store = backend.open()
    return backend, store, store.publish(BASE_AS_OF, "base", payload("base")).version


@pytest.mark.slow
def test_local_process_killed_mid_publish_keeps_previous_latest(
    local_published: tuple[Backend, ParameterStore, str],
) -> None:
    backend, store, base = local_published
    process = multiprocessing.get_context("spawn").Process(target=_crash_in_pointer_replace, args=(backend.uri,))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 3
    assert store.resolve().version == base
    assert "2024-03-02-crash" in store.list_versions()  # written, never made latest
    # The dead process's lock is gone (flock) and its temp file does not confuse anything.
    started = time.monotonic()
    result = LocalStore(backend.uri, lock_timeout=5.0).publish("2024-03-03", "after", payload("after"))
    assert result.moved and time.monotonic() - started < 2
    assert result.pointer.previous == base


def test_local_disk_error_during_pointer_move(
    local_published: tuple[Backend, ParameterStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, store, base = local_published

    def no_space(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_store_module.os, "replace", no_space)
    with pytest.raises(StoreError, match="No space left") as info:
        store.publish("2024-03-02", "full", payload("full"))
    assert str(Path(backend.uri) / LATEST) in assert_one_line(info.value)
    monkeypatch.undo()
    assert store.resolve().version == base
    assert not [p for p in Path(backend.uri).iterdir() if p.name.startswith(".latest.tmp")]


# ---------------------------------------------------------------------------------------------
# Bad input: URIs and credentials
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["s3://bucket/params", "http://example.invalid/p", "hdfs://nn/p"])
def test_unknown_scheme_is_rejected(uri: str) -> None:
    with pytest.raises(ValueError, match="unknown store scheme") as info:
        open_store(uri)
    assert uri.split(":", maxsplit=1)[0] in assert_one_line(info.value)


@pytest.mark.parametrize("uri", ["", "gs://", "gs://UPPER/x", "file://remotehost/x"])
def test_malformed_uri_is_rejected(uri: str) -> None:
    with pytest.raises(ValueError):
        open_store(uri)


def test_local_uri_forms(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    store = open_store(f"file://{tmp_path}/s")
    assert isinstance(store, LocalStore) and store.uri == str(tmp_path / "s")


def test_missing_gcs_credentials_give_one_helpful_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # never probe a metadata server
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud ADC file
    for credentials in (str(tmp_path / "missing-key.json"), None):
        if credentials is None:
            monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        else:
            monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", credentials)
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            open_store("gs://some-bucket/params")
        message = assert_one_line(info.value)
        assert "gcloud auth application-default login" in message
        assert "STORAGE_EMULATOR_HOST" in message
        assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback
        assert time.monotonic() - started < 5


def test_gcs_store_on_missing_bucket(fake_gcs_server: EmulatorHandle) -> None:  # noqa: F811
    store = open_store("gs://no-such-bucket-araopt/params", gcs_retry_deadline=1.0)
    with pytest.raises(StoreError, match="no-such-bucket-araopt") as info:
        store.publish(BASE_AS_OF, "x", payload("x"))
    assert_one_line(info.value)


def test_params_ref_forms(published: tuple[Backend, ParameterStore, str]) -> None:
    backend, store, base = published
    assert parse_params_ref(backend.uri) == (backend.uri, LATEST)
    assert parse_params_ref(f"{backend.uri}/versions/{base}") == (backend.uri, base)
    assert parse_params_ref(f"{backend.uri}/versions/{base}/params.json") == (backend.uri, base)
    kwargs = {"gcs_retry_deadline": 5.0}
    assert resolve_params_ref(backend.uri, **kwargs).version == base
    assert resolve_params_ref(f"{backend.uri}/versions/{base}/", **kwargs).payload == payload("base")


def test_gcs_uri_maps_to_bucket_and_prefix(fake_gcs_server: EmulatorHandle) -> None:  # noqa: F811
    store = open_store(f"gs://{fake_gcs_server.bucket}/a/b/")
    assert isinstance(store, GcsStore)
    assert store.uri == f"gs://{fake_gcs_server.bucket}/a/b"
    store.publish(BASE_AS_OF, "r", payload("r"))
    names = sorted(b.name for b in fake_gcs_server.client().list_blobs(fake_gcs_server.bucket))
    assert names == [
        "a/b/latest",
        f"a/b/versions/{BASE_AS_OF}-r/params.json",
        f"a/b/versions/{BASE_AS_OF}-r/params.json.sha256",
    ]


# ---------------------------------------------------------------------------------------------
# Emulator facts the suite relies on
# ---------------------------------------------------------------------------------------------


def test_gcp_storage_emulator_fixture_serves_gcs_api(gcp_storage_emulator: EmulatorHandle) -> None:  # noqa: F811
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcp_storage_emulator.url
    store = open_store(gcp_storage_emulator.store_uri("p"))
    store.publish(BASE_AS_OF, "r", payload("r"))
    assert store.resolve().payload == payload("r")
    # Why races are tested on fake-gcs-server: this emulator ignores generation preconditions.
    from google.api_core.exceptions import PreconditionFailed

    blob = gcp_storage_emulator.client().bucket(gcp_storage_emulator.bucket).blob("p/latest")
    try:
        blob.upload_from_string(b"{}", if_generation_match=0)  # HTTP 412 on real GCS
    except PreconditionFailed:
        pytest.fail("gcp-storage-emulator now honours preconditions: update this test and the notes")


# ---------------------------------------------------------------------------------------------
# Release ledger (index moved by compare-and-swap, content-addressed row sets)
# ---------------------------------------------------------------------------------------------


def _entry(tag: str) -> dict[str, object]:
    return {"id": tag, "rows": 1, "first_time_us": 0, "last_time_us": 1}


def test_ledger_appends_only_from_the_generation_it_read(backend: Backend) -> None:
    store = backend.open()
    assert store.read_ledger() == ([], 0)
    _, generation = store.read_ledger()
    recorded = store.append_release(_entry("a"), b"rows of a", generation)
    assert recorded["row_set_sha256"] == hashlib.sha256(b"rows of a").hexdigest()
    assert store.read_row_set(recorded) == b"rows of a"
    with pytest.raises(StoreConflict):  # a second recorder that read the same generation loses
        store.append_release(_entry("b"), b"rows of b", generation)
    releases, generation = store.read_ledger()
    assert [e["id"] for e in releases] == ["a"]
    store.append_release(_entry("b"), b"rows of a", generation)  # same rows: one object, two entries
    store.remove_release("a")
    assert [e["id"] for e in store.read_ledger()[0]] == ["b"]


def test_ledger_refuses_a_corrupt_index_and_a_tampered_row_set(backend: Backend) -> None:
    store = backend.open()
    recorded = store.append_release(_entry("a"), b"rows", 0)
    backend.write_raw(recorded["row_set"], b"other rows")
    with pytest.raises(StoreError, match="does not match its sha256"):
        store.read_row_set(recorded)
    backend.write_raw("ledger/index.json", b'{"format": "araopt-ledger/2", "releases": [{"id": "x"}]')
    assert "not valid JSON" in assert_one_line(pytest.raises(StoreError, store.read_ledger).value)


def test_ledger_append_whose_retry_reports_a_conflict_after_succeeding_is_recorded_once(backend: Backend) -> None:
    store = backend.open()
    original = store._swap_cas

    def succeed_then_report_conflict(key: str, data: bytes, generation: int) -> None:
        original(key, data, generation)
        raise StoreConflict("the retried request saw its own write")

    store._swap_cas = succeed_then_report_conflict  # type: ignore[method-assign]
    store.append_release(_entry("a"), b"rows", 0)
    store._swap_cas = original  # type: ignore[method-assign]
    assert [e["id"] for e in store.read_ledger()[0]] == ["a"]
