"""A traced request's own CPU time, in one process: its door's span (opened, validated, finished, ended)
and its engine core's span (written from its Final), each --requests times against an OTLP receiver
in this process (benchmarks/otlp_receiver.py), the export thread's encoding and sending included
(process_time). Prints microseconds a request for each; the JSON object last.

    python -m benchmarks.tracing_cost [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import time

from attnserve.engine.domain import Final, FinishReason, GenerationRequest, Timings, Usage
from attnserve.tracing.core_spans import CoreSpans
from attnserve.tracing.exporting import Tracing
from attnserve.tracing.request import RequestTraces
from attnserve.tracing.settings import TraceSettings
from benchmarks.otlp_receiver import Receiver

DOOR = "attnserve.v1.TextGeneration/GenerateStream"
RPC = {"rpc.system": "grpc", "rpc.service": "attnserve.v1.TextGeneration", "rpc.method": "GenerateStream"}
CALLER = {"traceparent": "00-01234567890123456789012345678901-1234567890123456-01"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    args = p.parse_args(argv)
    receiver = Receiver().start()
    tracing = Tracing(TraceSettings(receiver.endpoint), "front_end")
    doors, core = RequestTraces(tracing, "small"), CoreSpans(tracing, 256)
    request = GenerationRequest("req-1", tuple(range(16)), 96)
    final = Final(FinishReason.LENGTH, "", Usage(16, 96, 0), Timings(1.0, 5.0, 100.0))
    traced = request
    result = {}
    for side in ("door", "core"):
        start = time.process_time()
        for _ in range(args.requests):
            if side == "door":
                trace = doors.open(DOOR, CALLER, {**RPC, "gen_ai.operation.name": "text_completion"})
                traced = trace.submitting(request)
                trace.finished(final)
                trace.end("OK", None, {"rpc.grpc.status_code": 0})
            else:
                core.ended(traced, final, 96, time.time_ns())
        tracing.export.force_flush()
        while len(tracing.export.queue):  # its encoding and sending count too
            time.sleep(0.01)
        result[f"{side}_us_per_request"] = round((time.process_time() - start) / args.requests * 1e6, 1)
        print(f"{side}: {result[f'{side}_us_per_request']} us a request", flush=True)
    tracing.shutdown()
    receiver.stop()
    result["spans_received"] = len(receiver.spans)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
