"""A translated Dataflow job as a graph, for tests that assert its shape.

A dry run (``--runner DataflowRunner --dry_run True --dataflow_job_file F``) writes the job
description F and, beside it, ``F.pipeline.pb``: the portable pipeline the description points to
(``pipelineUrl``, ``pipelineProtoHash``), after the Dataflow runner's own rewrites. ``JobGraph``
reads it: its primitive steps (leaf transforms) with their DoFn or CombineFn unpickled, which
collection each step reads (main and side inputs) and writes, and which collections carry row data.

Row data: every collection downstream of the Parquet reads that has not passed through a combine
(a lifted ``CombinePerKey``: bounded accumulators) or a file sink (which emits file names). A step
that groups row data on one key, or a side input made of row data, holds the whole input in one
worker.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2 as pb

PARDO = common_urns.primitives.PAR_DO.urn
GROUP_BY_KEY = common_urns.primitives.GROUP_BY_KEY.urn
COMBINE_PER_KEY = common_urns.composites.COMBINE_PER_KEY.urn
PICKLED_DOFN = "beam:dofn:pickled_python_info:v1"
READ_FNS = ("_ReadRange",)  # Beam's file-based source: reads the Parquet row groups
SINK_FNS = ("_WriteBundleDoFn", "_WriteKeyedBundleDoFn")  # Beam's file sinks: emit written file names


@dataclass
class Step:
    """A primitive transform of the translated pipeline."""

    id: str
    name: str
    urn: str
    main_inputs: list[str]
    side_inputs: list[str]
    outputs: list[str]
    fn: Any = None  # the unpickled DoFn (ParDo) or CombineFn (the combine a GroupByKey belongs to)
    combine: str | None = None  # name of the CombinePerKey composite this step belongs to
    row_data_out: bool = field(default=False)

    @property
    def fn_type(self) -> str:
        return type(self.fn).__name__ if self.fn is not None else ""


class JobGraph:
    """The primitive steps of a translated job and the collections between them."""

    def __init__(self, job_file: str):
        with open(job_file) as fh:
            self.job = json.load(fh)
        with open(job_file + ".pipeline.pb", "rb") as fh:
            raw = fh.read()
        self.pipeline_sha256 = hashlib.sha256(raw).hexdigest()
        proto = pb.Pipeline.FromString(raw)
        transforms = proto.components.transforms
        parent = {child: tid for tid, t in transforms.items() for child in t.subtransforms}
        self.steps: dict[str, Step] = {}
        for tid, t in transforms.items():
            if t.subtransforms:
                continue
            combine = None
            up = parent.get(tid)
            while up is not None and combine is None:
                if transforms[up].spec.urn == COMBINE_PER_KEY:
                    combine = up
                up = parent.get(up)
            fn, side = None, set()
            if t.spec.urn == PARDO:
                payload = pb.ParDoPayload.FromString(t.spec.payload)
                side = set(payload.side_inputs)
                if payload.do_fn.urn == PICKLED_DOFN:
                    fn = pickler.loads(payload.do_fn.payload)[0]  # (DoFn, args, kwargs, side inputs, windowing)
            if combine is not None:
                fn = pickler.loads(pb.CombinePayload.FromString(transforms[combine].spec.payload).combine_fn.payload)
            self.steps[tid] = Step(tid, t.unique_name, t.spec.urn, [p for tag, p in t.inputs.items() if tag not in side],
                                   [p for tag, p in t.inputs.items() if tag in side], list(t.outputs.values()), fn,
                                   transforms[combine].unique_name if combine else None)
        self.producer = {p: s for s in self.steps.values() for p in s.outputs}
        self._mark_row_data()

    # ---- queries ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    def find(self, urn: str | None = None, fn_type: str | None = None) -> list[Step]:
        return [s for s in self.steps.values()
                if (urn is None or s.urn == urn) and (fn_type is None or s.fn_type == fn_type)]

    def one(self, urn: str | None = None, fn_type: str | None = None) -> Step:
        found = self.find(urn, fn_type)
        assert len(found) == 1, f"expected exactly one step ({urn}, {fn_type}), found {[s.name for s in found]}"
        return found[0]

    def combines(self, fn_type: str) -> list[Step]:
        """The GroupByKey of every CombinePerKey whose CombineFn is ``fn_type`` (one per combine); for the
        project's one generic ``CombinerFn``, ``fn_type`` names the core combiner it runs (or one it
        specialises: the statistics step's shard-reading ``StatisticsCombiner``)."""
        def kinds(s: Step) -> set[str]:
            inner = getattr(s.fn, "_combiner", None)
            return {c.__name__ for c in type(inner).__mro__} if inner is not None else {str(s.fn_type)}

        return [s for s in self.find(GROUP_BY_KEY) if s.combine and fn_type in kinds(s)]

    def upstream(self, step: Step, through_side_inputs: bool = False) -> Iterator[Step]:
        """Every step ``step`` reads from, transitively (main inputs only unless asked)."""
        seen: set[str] = set()
        todo = list(step.main_inputs) + (list(step.side_inputs) if through_side_inputs else [])
        while todo:
            producer = self.producer.get(todo.pop())
            if producer is None or producer.id in seen:
                continue
            seen.add(producer.id)
            yield producer
            todo.extend(producer.main_inputs + (producer.side_inputs if through_side_inputs else []))

    def path(self, start: Step, end: Step, through_side_inputs: bool = False) -> list[Step]:
        """Steps on paths from ``start`` to ``end`` (both included; main inputs only unless asked); [] if none."""
        above = {s.id for s in self.upstream(end, through_side_inputs)}
        if start.id not in above:
            return []
        below = {start.id}
        changed = True
        while changed:
            changed = False
            for s in self.steps.values():
                reads = s.main_inputs + (s.side_inputs if through_side_inputs else [])
                if s.id not in below and s.id in above and any(
                        self.producer.get(p) is not None and self.producer[p].id in below for p in reads):
                    below.add(s.id)
                    changed = True
        return [s for s in self.steps.values() if s.id in below] + [end]

    def is_row_data(self, pcollection: str) -> bool:
        producer = self.producer.get(pcollection)
        return producer is not None and producer.row_data_out

    # ---- the whole-input checks ----------------------------------------------------------------
    def _mark_row_data(self) -> None:
        changed = True
        while changed:
            changed = False
            for s in self.steps.values():
                if s.row_data_out:
                    continue
                reads = s.fn_type in READ_FNS
                carries = any(self.is_row_data(p) for p in s.main_inputs)
                if (reads or carries) and s.combine is None and s.fn_type not in SINK_FNS:
                    s.row_data_out = True
                    changed = True

    def row_data_groupings(self) -> list[Step]:
        """GroupByKeys over row data outside a combine (each holds its keys' rows in one worker)."""
        return [s for s in self.find(GROUP_BY_KEY) if s.combine is None and any(map(self.is_row_data, s.main_inputs))]

    def row_data_side_inputs(self) -> list[tuple[Step, str]]:
        """(step, side input) pairs whose side input is row data (materialised whole in every worker)."""
        return [(s, p) for s in self.steps.values() for p in s.side_inputs if self.is_row_data(p)]

    def sink_paths(self) -> list[str]:
        """Where the file sinks of the job write (their file path prefixes)."""
        out = []
        for s in self.steps.values():
            if s.fn_type in SINK_FNS:
                prefix = s.fn.sink.file_path_prefix
                out.append(prefix.get() if hasattr(prefix, "get") else str(prefix))
        return out

    def summary(self) -> str:
        return (f"{len(self)} steps ({len(self.row_data_groupings())} GroupByKey of row data, "
                f"{len(self.row_data_side_inputs())} side inputs of row data, {len(self.sink_paths())} file sinks)")
