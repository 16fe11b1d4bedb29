"""engram.memory.v1.MemoryService: remember, recall, read, change and forget memories one by
one, their jobs and history; each method is its HTTP route's translation (api/http.py)."""

from __future__ import annotations


from api.grpc.calls import PATH, Call, Servicer, streaming, unary, watch
from api.grpc.convert import reply, request_dict
from api.grpc.params import ForgetParams, ListParams, checked, uuid_of
from engram.domain.changes import ConfirmRequest, MemoryPatch, ModifyBatchRequest, RecoverRequest, RollbackRequest
from engram.domain.models import RememberBatchRequest, RememberRequest, Scope, SearchFilters, SearchRequest
from engram_grpc.memory.v1 import memory_pb2 as pb
from engram_grpc.memory.v1 import memory_pb2_grpc

JOB_ENDS = ("done", "dead")


class Memories(Servicer, memory_pb2_grpc.MemoryServiceServicer):
    @property
    def changes(self):
        return self.runtime.changes

    @unary
    async def Remember(self, request: pb.RememberRequest, call: Call) -> pb.RememberResponse:
        body = checked(RememberRequest, request_dict(request))
        ctx = call.change
        if ctx.idempotency_key and body.idempotency_key is None:  # the metadata serves as the field
            body = body.model_copy(update={"idempotency_key": ctx.idempotency_key})
        answer = await self.service.remember(call.principal, body, request_id=call.request_id, path=PATH,
                                             model=ctx.model)
        return reply(pb.RememberResponse, answer)

    @unary
    async def RememberBatch(self, request: pb.RememberBatchRequest, call: Call) -> pb.RememberBatchResponse:
        body = checked(RememberBatchRequest, request_dict(request))
        ctx, items = call.change, body.items
        if ctx.idempotency_key:  # each item without a key of its own: `<key>:<index>`, as HTTP
            items = [{"idempotency_key": f"{ctx.idempotency_key}:{i}", **item} for i, item in enumerate(items)]
        answer = await self.service.remember_batch(call.principal, items, request_id=call.request_id, path=PATH,
                                                   model=ctx.model)
        return reply(pb.RememberBatchResponse, answer)

    @unary
    async def Search(self, request: pb.SearchRequest, call: Call) -> pb.SearchResponse:
        return reply(pb.SearchResponse, await self.service.search(call.principal,
                                                                  checked(SearchRequest, request_dict(request))))

    @unary
    async def GetMemory(self, request: pb.GetMemoryRequest, call: Call) -> pb.Memory:
        return reply(pb.Memory, await self.service.get(call.principal, uuid_of(request.memory_id, "memory_id")))

    @unary
    async def ListMemories(self, request: pb.ListMemoriesRequest, call: Call) -> pb.MemoryPage:
        q = checked(ListParams, request_dict(request), "query")  # named as HTTP names its query parameters
        scope = checked(Scope, {"user_id": q.user_id, "agent_id": q.agent_id, "run_id": q.run_id}, "query")
        filters = checked(SearchFilters, q.model_dump(include={"kind", "type", "tags", "who", "source_type", "time",
                                                               "memory_type", "trust", "min_confidence"}), "query")
        page = await self.service.list(call.principal, scope, filters, include_deleted=q.include_deleted,
                                       cursor=q.cursor, limit=q.limit, status=q.status,
                                       include_expired=q.include_expired)
        return reply(pb.MemoryPage, page)

    @unary
    async def GetJob(self, request: pb.GetJobRequest, call: Call) -> pb.Job:
        return reply(pb.Job, await self.service.job(call.principal, uuid_of(request.job_id, "job_id")))

    @streaming
    async def WatchJob(self, request: pb.GetJobRequest, call: Call):
        """The job, then each change of it, until it is done or dead."""
        job_id = uuid_of(request.job_id, "job_id")
        async for job in watch(lambda: self.service.job(call.principal, job_id), JOB_ENDS):
            yield reply(pb.Job, job)

    @unary
    async def ModifyMemory(self, request: pb.ModifyMemoryRequest, call: Call) -> pb.Memory:
        fields = request_dict(request)
        memory_id = uuid_of(fields.pop("memory_id", ""), "memory_id")
        patch = checked(MemoryPatch, fields)
        return reply(pb.Memory, await self.changes.modify(call.principal, memory_id, patch, call.change))

    @unary
    async def ModifyMemories(self, request: pb.ModifyMemoriesRequest, call: Call) -> pb.ModifyBatchResponse:
        body = checked(ModifyBatchRequest, request_dict(request))
        return reply(pb.ModifyBatchResponse, await self.changes.modify_batch(call.principal, body.items, call.change))

    @unary
    async def ForgetMemory(self, request: pb.ForgetMemoryRequest, call: Call) -> pb.Memory:
        fields = request_dict(request)
        memory_id = uuid_of(fields.pop("memory_id", ""), "memory_id")
        q = checked(ForgetParams, fields, "query")
        memory = await self.changes.forget(call.principal, memory_id, reason=q.reason, force=q.force,
                                           if_version=q.if_version, ctx=call.change)
        return reply(pb.Memory, memory)

    @unary
    async def RecoverMemory(self, request: pb.RecoverMemoryRequest, call: Call) -> pb.Memory:
        fields = request_dict(request)
        memory_id = uuid_of(fields.pop("memory_id", ""), "memory_id")
        body = checked(RecoverRequest, fields)
        return reply(pb.Memory, await self.changes.recover(call.principal, memory_id, body, call.change))

    @unary
    async def RollbackMemory(self, request: pb.RollbackMemoryRequest, call: Call) -> pb.Memory:
        fields = request_dict(request)
        memory_id = uuid_of(fields.pop("memory_id", ""), "memory_id")
        body = checked(RollbackRequest, fields)
        return reply(pb.Memory, await self.changes.rollback(call.principal, memory_id, body, call.change))

    @unary
    async def ConfirmMemory(self, request: pb.ConfirmMemoryRequest, call: Call) -> pb.Memory:
        fields = request_dict(request)
        memory_id = uuid_of(fields.pop("memory_id", ""), "memory_id")
        body = checked(ConfirmRequest, fields)
        return reply(pb.Memory, await self.changes.confirm(call.principal, memory_id, body, call.change))

    @unary
    async def GetHistory(self, request: pb.GetHistoryRequest, call: Call) -> pb.MemoryHistory:
        history = await self.changes.history(call.principal, uuid_of(request.memory_id, "memory_id"))
        return reply(pb.MemoryHistory, history)

    @unary
    async def VerifyChains(self, request, call: Call) -> pb.VerifyReport:
        return reply(pb.VerifyReport, await self.changes.verify(call.principal))
