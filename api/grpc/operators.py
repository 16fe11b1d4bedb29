"""The operators' services of engram.memory.v1: ReviewService (contradictions kept for a
person), ApprovalService (writes held for approval), ControlService (the switches) and
KeyService (API keys); each method is its HTTP route's translation (api/http.py)."""

from __future__ import annotations

from api.grpc.calls import PATH, Call, Servicer, unary
from api.grpc.convert import reply, request_dict
from api.grpc.params import ApprovalListParams, ReviewListParams, checked, uuid_of
from engram.domain.approvals import DecideRequest
from engram.domain.control import SwitchChange
from engram.domain.models import CreatedKey, KeyList, KeyRequest
from engram.domain.reviews import ResolveRequest
from engram_grpc.memory.v1 import memory_pb2 as pb
from engram_grpc.memory.v1 import memory_pb2_grpc


class Reviews(Servicer, memory_pb2_grpc.ReviewServiceServicer):
    @unary
    async def ListReviews(self, request: pb.ListReviewsRequest, call: Call) -> pb.ReviewPage:
        q = checked(ReviewListParams, request_dict(request), "query")
        return reply(pb.ReviewPage, await self.runtime.reviews.list(call.principal, status=q.status, limit=q.limit))

    @unary
    async def GetReview(self, request: pb.GetReviewRequest, call: Call) -> pb.Review:
        return reply(pb.Review, await self.runtime.reviews.get(call.principal, uuid_of(request.review_id, "review_id")))

    @unary
    async def ResolveReview(self, request: pb.ResolveReviewRequest, call: Call) -> pb.Review:
        fields = request_dict(request)
        review_id = uuid_of(fields.pop("review_id", ""), "review_id")
        body = checked(ResolveRequest, fields)
        return reply(pb.Review, await self.runtime.reviews.resolve(call.principal, review_id, body, path=PATH))


class Approvals(Servicer, memory_pb2_grpc.ApprovalServiceServicer):
    @unary
    async def ListApprovals(self, request: pb.ListApprovalsRequest, call: Call) -> pb.ApprovalPage:
        q = checked(ApprovalListParams, request_dict(request), "query")
        page = await self.runtime.approvals.list(call.principal, status=q.status, limit=q.limit)
        return reply(pb.ApprovalPage, page)

    @unary
    async def GetApproval(self, request: pb.GetApprovalRequest, call: Call) -> pb.Approval:
        approval_id = uuid_of(request.approval_id, "approval_id")
        return reply(pb.Approval, await self.runtime.approvals.get(call.principal, approval_id))

    @unary
    async def DecideApproval(self, request: pb.DecideApprovalRequest, call: Call) -> pb.Approval:
        fields = request_dict(request)
        approval_id = uuid_of(fields.pop("approval_id", ""), "approval_id")
        body = checked(DecideRequest, fields)
        return reply(pb.Approval, await self.runtime.approvals.decide(call.principal, approval_id, body, path=PATH))


class Control(Servicer, memory_pb2_grpc.ControlServiceServicer):
    @unary
    async def GetControl(self, request, call: Call) -> pb.ControlStatus:
        return reply(pb.ControlStatus, await self.runtime.control.status_for(call.principal))

    @unary
    async def ChangeControl(self, request: pb.SwitchChange, call: Call) -> pb.ControlStatus:
        body = checked(SwitchChange, request_dict(request))
        return reply(pb.ControlStatus, await self.runtime.control.change(call.principal, body))


class Keys(Servicer, memory_pb2_grpc.KeyServiceServicer):
    @unary
    async def CreateKey(self, request: pb.KeyRequest, call: Call) -> pb.CreatedKey:
        body = checked(KeyRequest, request_dict(request))
        secret, record = await self.service.create_key(call.principal, name=body.name, role=body.role,
                                                       scopes=body.scopes)
        return reply(pb.CreatedKey, CreatedKey(key=secret, **record.model_dump()))

    @unary
    async def ListKeys(self, request, call: Call) -> pb.KeyList:
        return reply(pb.KeyList, KeyList(items=await self.service.list_keys(call.principal)))

    @unary
    async def RevokeKey(self, request: pb.RevokeKeyRequest, call: Call) -> pb.ApiKey:
        return reply(pb.ApiKey, await self.service.revoke_key(call.principal, uuid_of(request.key_id, "key_id")))
