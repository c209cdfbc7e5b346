"""The Open Inference Protocol (KServe v2 / Triton gRPC) over the same engine as attnserve.v1.

Served on the same server, port, TLS, auth, limits, metrics and error mapping as the attnserve.v1
service: requests are read as the vLLM backend reads them (request.py, tensors.py), validated by
the session's validate, and decoded by the same engine. ModelInfer returns the whole completion;
ModelStreamInfer takes requests on one stream and runs them concurrently, a response per delta
with `stream` true (at the stream interval), the last one carrying the parameter
triton_final_response = true. As in Triton, a request that fails on a stream gets an in-band
error_message and the stream goes on; on ModelInfer the error is the call's status.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace

import grpc

from ...engine.domain import (
    Final,
    GenerationRequest,
    InvalidRequest,
    ServeError,
    StreamInterval,
    UnknownModel,
)
from ...engine.engine import EngineCalls
from ...inference import grpc_service_pb2 as oip
from ...inference import grpc_service_pb2_grpc as oip_grpc
from ...tokenizer import Tokenizer
from ...v1 import generation_pb2 as pb
from ..grpc_boundary.calls import deadline_of
from ..grpc_boundary.statuses import ERROR_CODES
from ..session.events import completions, generation_events, messages
from ..session.validation import RequestLimits, check_stream_interval, validate
from ..session.vllm_names import FINISH_REASONS
from .request import (
    FINISH_REASON,
    INPUTS,
    NUM_INPUT,
    NUM_OUTPUT,
    OUTPUTS,
    TEXT_OUTPUT,
    InferCall,
    read_call,
)
from .tensors import raw_output

SERVICE = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
VERSION = "1"  # the one version of the one model a server serves
PLATFORM = "attnserve_onnxruntime"
FINAL_FLAG = "triton_final_response"
STREAM_OUT_MAX = 16  # responses of one ModelStreamInfer stream waiting to be written


class InferenceServicer(oip_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService for the served model."""

    def __init__(
        self,
        engine: EngineCalls,
        limits: RequestLimits,
        tokenizer: Tokenizer,
        info: pb.ModelInfo,
        ready: Callable[[], bool],
        count: Callable[[str, str], None] = lambda *_: None,
    ):
        self.engine, self.limits, self.tokenizer = engine, limits, tokenizer
        self.model_name, self.server_version = info.model_name, info.server_version
        self.ready, self.count = ready, count

    # ---- health and metadata ------------------------------------------------------------
    async def ServerLive(self, request: oip.ServerLiveRequest, context) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request: oip.ServerReadyRequest, context) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=self.ready())

    async def ModelReady(self, request: oip.ModelReadyRequest, context) -> oip.ModelReadyResponse:
        return oip.ModelReadyResponse(ready=self.ready() and self.serves(request.name, request.version))

    async def ServerMetadata(self, request: oip.ServerMetadataRequest, context) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(name="attnserve", version=self.server_version, extensions=[])

    async def ModelMetadata(self, request: oip.ModelMetadataRequest, context) -> oip.ModelMetadataResponse:
        self.check_model(request.name, request.version)
        return oip.ModelMetadataResponse(
            name=self.model_name,
            versions=[VERSION],
            platform=PLATFORM,
            inputs=[spec.metadata() for spec in INPUTS.values()],
            outputs=[spec.metadata() for spec in OUTPUTS.values()],
        )

    def serves(self, name: str, version: str) -> bool:
        return name == self.model_name and version in ("", VERSION)

    def check_model(self, name: str, version: str) -> None:
        if not self.serves(name, version):
            asked = f"{name!r:.80}" + (f" version {version!r:.40}" if version else "")  # a client's strings, cut
            raise UnknownModel(f"model {asked} is not served here (this server serves {self.model_name!r}, version 1)")

    # ---- inference ----------------------------------------------------------------------
    async def ModelInfer(self, request: oip.ModelInferRequest, context) -> oip.ModelInferResponse:
        """The whole completion in one response (`stream` must be false here)."""
        call, generation = self.accept(request, context)
        if call.stream:
            raise InvalidRequest("stream", "true needs ModelStreamInfer (a response per delta)")
        self.interval(call)
        return await self.whole(request, call, generation)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[oip.ModelInferRequest], context
    ) -> AsyncIterator[oip.ModelStreamInferResponse]:
        """Each request as it arrives, concurrently; responses interleave, each request's in order."""
        # Bounded: while the client reads nothing, the requests' own buffers fill up and hit their cap.
        out: asyncio.Queue[oip.ModelStreamInferResponse | Exception | None] = asyncio.Queue(STREAM_OUT_MAX)
        running: set[asyncio.Task] = set()

        async def one(request: oip.ModelInferRequest) -> None:
            try:
                call, generation = self.accept(request, context)
                interval = self.interval(call)
                if not call.stream:  # one response, this request's last
                    response = await self.whole(request, call, generation, last=True)
                    await out.put(oip.ModelStreamInferResponse(infer_response=response))
                    return
                async with aclosing(self.streamed(request, call, generation, interval)) as responses:
                    async for response in responses:
                        await out.put(oip.ModelStreamInferResponse(infer_response=response))
            except ServeError as error:
                self.count("ModelStreamInfer", ERROR_CODES.get(type(error), grpc.StatusCode.INTERNAL).name)
                await out.put(oip.ModelStreamInferResponse(error_message=str(error)))

        async def read() -> None:
            try:
                async for request in requests:
                    task = asyncio.create_task(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.gather(*list(running))
                await out.put(None)
            except Exception as error:  # noqa: BLE001 -- handed to the handler, which raises it
                await out.put(error)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            for task in (reader, *running):
                task.cancel()

    def accept(self, request: oip.ModelInferRequest, context) -> tuple[InferCall, GenerationRequest]:
        """The request read and validated; errors name the tensor or parameter the caller sent. With no
        room in the engine it is refused first, unread (a refusal under overload costs no parsing)."""
        self.engine.check_room()
        self.check_model(request.model_name, request.model_version)
        call = read_call(request)
        return call, validate(call.request, self.limits, self.tokenizer, deadline_of(context))

    def interval(self, call: InferCall) -> StreamInterval:
        """The call's stream interval; errors name the parameter the caller sent."""
        return check_stream_interval(call.request, self.limits)

    async def whole(
        self,
        request: oip.ModelInferRequest,
        call: InferCall,
        generation: GenerationRequest,
        last: bool | None = None,
    ) -> oip.ModelInferResponse:
        """One response with the whole completion (the prompt first unless exclude_input_in_output)."""
        (whole,) = await completions(self.engine, generation)  # n is always 1 here
        text, token_ids, final = whole.text, whole.token_ids, whole.end
        prompt = call.request.prompt if call.prepend_prompt else ""
        return self.response(request, call, prompt + text, final, len(generation.prompt_ids), len(token_ids), last)

    async def streamed(
        self,
        request: oip.ModelInferRequest,
        call: InferCall,
        generation: GenerationRequest,
        interval: StreamInterval,
    ) -> AsyncGenerator[oip.ModelInferResponse, None]:
        """A response per message (the engine holds deltas to the stream interval); the last one carries
        the end and triton_final_response."""
        generation = replace(generation, interval=interval)
        async with aclosing(generation_events(self.engine, generation)) as batches:
            async for _, deltas, final in messages(batches):
                body = "".join(d.text for d in deltas) + (final.text if final is not None else "")
                count = sum(len(d.token_ids) for d in deltas)
                yield self.response(
                    request, call, body, final, len(generation.prompt_ids), count, last=final is not None
                )

    def response(
        self,
        request: oip.ModelInferRequest,
        call: InferCall,
        text: str,
        final: Final | None,
        prompt_tokens: int,
        tokens: int,
        last: bool | None = None,
    ) -> oip.ModelInferResponse:
        """A response with the outputs the call asked for; `last` sets triton_final_response (ModelStreamInfer)."""
        values: dict[str, str | int] = {
            TEXT_OUTPUT: text,
            FINISH_REASON: FINISH_REASONS[final.reason] if final is not None else "",
            NUM_INPUT: prompt_tokens,
            NUM_OUTPUT: tokens,
        }
        message = oip.ModelInferResponse(model_name=self.model_name, model_version=VERSION, id=request.id)
        for name in call.outputs:
            tensor, raw = raw_output(name, OUTPUTS[name].datatype, values[name])
            message.outputs.append(tensor)
            message.raw_output_contents.append(raw)
        if last is not None:
            message.parameters[FINAL_FLAG].bool_param = last
        return message
