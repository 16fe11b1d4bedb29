"""engram.memory.v1.ForgetService: batch forget (preview, execute, progress, undo), its
approvals and erasure receipts; each method is its HTTP route's translation (api/http.py)."""

from __future__ import annotations


from api.grpc.calls import Call, Servicer, streaming, unary, watch
from api.grpc.convert import reply, request_dict
from api.grpc.params import checked, operation_id
from engram.domain.forget import Decision, ForgetExecute, ForgetRequest, ReceiptCheck
from engram_grpc.memory.v1 import memory_pb2 as pb
from engram_grpc.memory.v1 import memory_pb2_grpc

OPERATION_ENDS = ("done", "expired", "rejected", "stale", "dry_run")


class Forgets(Servicer, memory_pb2_grpc.ForgetServiceServicer):
    @property
    def forgets(self):
        return self.runtime.forgets

    @unary
    async def PreviewForget(self, request: pb.ForgetRequest, call: Call) -> pb.ForgetPreview:
        body = checked(ForgetRequest, request_dict(request))
        return reply(pb.ForgetPreview, await self.forgets.preview(call.principal, body))

    @unary
    async def ExecuteForget(self, request: pb.ExecuteForgetRequest, call: Call) -> pb.ForgetStatus:
        fields = request_dict(request)
        op = operation_id(fields.pop("operation_id", ""))
        body = checked(ForgetExecute, fields)
        return reply(pb.ForgetStatus, await self.forgets.execute(call.principal, op, body, call.change))

    @unary
    async def GetForget(self, request: pb.GetForgetRequest, call: Call) -> pb.ForgetStatus:
        return reply(pb.ForgetStatus, await self.forgets.status(call.principal, operation_id(request.operation_id)))

    @streaming
    async def WatchOperation(self, request: pb.GetForgetRequest, call: Call):
        """The operation, then each change of it, until it has ended (OPERATION_ENDS)."""
        op = operation_id(request.operation_id)
        async for status in watch(lambda: self.forgets.status(call.principal, op), OPERATION_ENDS):
            yield reply(pb.ForgetStatus, status)

    @unary
    async def UndoForget(self, request: pb.DecideForgetRequest, call: Call) -> pb.UndoResult:
        op, body = self._decision(request)
        return reply(pb.UndoResult, await self.forgets.undo(call.principal, op, body, call.change))

    @unary
    async def ListForgetApprovals(self, request, call: Call) -> pb.OperationList:
        return reply(pb.OperationList, await self.forgets.approvals(call.principal))

    @unary
    async def ApproveForget(self, request: pb.DecideForgetRequest, call: Call) -> pb.ForgetStatus:
        op, body = self._decision(request)
        return reply(pb.ForgetStatus, await self.forgets.decide(call.principal, op, True, body))

    @unary
    async def RejectForget(self, request: pb.DecideForgetRequest, call: Call) -> pb.ForgetStatus:
        op, body = self._decision(request)
        return reply(pb.ForgetStatus, await self.forgets.decide(call.principal, op, False, body))

    @unary
    async def VerifyReceipt(self, request: pb.VerifyReceiptRequest, call: Call) -> pb.ReceiptCheck:
        receipt = request_dict(request).get("receipt", {})
        problems = await self.forgets.check_receipt(call.principal, receipt)
        return reply(pb.ReceiptCheck, ReceiptCheck(ok=not problems, problems=problems))

    @staticmethod
    def _decision(request: pb.DecideForgetRequest) -> tuple[str, Decision]:
        fields = request_dict(request)
        return operation_id(fields.pop("operation_id", "")), checked(Decision, fields)
