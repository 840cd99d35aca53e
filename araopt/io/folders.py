"""Data folders written whole or not at all (synth, split, load-criteo): each is written under a temporary
name beside its target and renamed into place when complete; ``--overwrite`` replaces only a folder
araopt wrote (it holds ``_manifest.json``), never an unrelated one; Parquet written in rolling shards."""
from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def check_replaceable(path: str | os.PathLike[str], overwrite: bool) -> None:
    """Refuse a non-empty ``path`` unless ``overwrite``, and even then unless it is an araopt output.

    An araopt output holds ``_manifest.json``; that rule keeps --overwrite from ever deleting an
    unrelated directory.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"output path {p} exists and is not a directory")
    if p.is_dir() and any(p.iterdir()):
        if not overwrite:
            raise ValueError(f"output directory {p} already holds data; pass --overwrite to replace it")
        if not (p / "_manifest.json").is_file():
            raise ValueError(f"refusing to overwrite {p}: not an araopt output directory (no _manifest.json)")


def check_output_dir(out_dir: str | os.PathLike[str], subdirs: Sequence[str], overwrite: bool) -> None:
    """The refusal rules of ``prepare_output_dir`` without touching the file system."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(f"output directory {out} already holds data; pass --overwrite to replace it")
        for sub in subdirs:
            check_replaceable(out / sub, overwrite=True)


def prepare_output_dir(out_dir: str | os.PathLike[str], subdirs: Sequence[str], overwrite: bool) -> Path:
    """Check ``out_dir`` (``check_output_dir``) and create it.

    With ``overwrite``, the ``subdirs`` (e.g. train/, test/) are replaced only when the new data
    is complete (``publish_dir``), so a failed run leaves the previous output intact. Other
    files in ``out_dir`` are never touched.
    """
    out = Path(out_dir)
    check_output_dir(out, subdirs, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    return out


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a finished temporary directory into place; an existing ``final`` is swapped out first."""
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)


class ParquetShardWriter:
    """Rolls Parquet files <prefix>-NNNNN.parquet in one directory, one row group per write."""

    def __init__(self, directory: str | os.PathLike[str], schema: pa.Schema, max_rows_per_file: int = 8_000_000,
                 compression: str = "snappy", prefix: str = "part", use_dictionary: bool | list[str] = True) -> None:
        self.directory, self.schema = Path(directory), schema
        self.max_rows, self.compression, self.prefix = max_rows_per_file, compression, prefix
        self.use_dictionary = use_dictionary
        self.files: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None or self._rows_in_file >= self.max_rows:
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.prefix}-{len(self.files):05d}.parquet"
            self._writer = pq.ParquetWriter(path, self.schema, compression=self.compression,
                                            use_dictionary=self.use_dictionary)
            self.files.append(str(path))
            self._rows_in_file = 0
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self._rows_in_file += table.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
