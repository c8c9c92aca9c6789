from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import (
    MAX_INT,
    AuditActivity,
    AuditCheckpointPublic,
    AuditEventPublic,
    AuditPage,
    AuditStatusPublic,
    AuditVerifyProblem,
    AuditVerifyRequest,
    KeyUsage,
    VerifyResultPublic,
)
from keyserver.core.audit import AuditFilter, AuditRecord, event_dict
from keyserver.core.errors import InvalidInput, NotFound
from keyserver.core.permissions import Permission

router = APIRouter(prefix="/audit", tags=["audit"])


def _filter(actor: str | None, action: str | None, object_type: str | None, object_id: str | None,
            outcome: str | None, since: datetime | None, until: datetime | None, q: str | None) -> AuditFilter:
    return AuditFilter(actor=actor, action=action, object_type=object_type, object_id=object_id,
                       outcome=outcome, since=since, until=until, q=q)


def _public(r: AuditRecord) -> AuditEventPublic:
    return AuditEventPublic(**event_dict(r), object_name=r.object_name)


Actor = Annotated[str | None, Query(max_length=300, description="exact, or a prefix ending in '*'")]
Action = Annotated[str | None, Query(max_length=64, description="exact, or a prefix ending in '.'")]
ObjType = Annotated[str | None, Query(max_length=32)]
ObjId = Annotated[str | None, Query(max_length=4096, description="exact, or a prefix ending in '*'")]
Search = Annotated[str | None, Query(max_length=200, description=(
    "words every record must hold, in any field or detail; 'pay*' is a prefix (docs/audit.md \"Searching\")"))]
OutcomeQ = Annotated[Literal["allowed", "denied", "error"] | None, Query()]
When = Annotated[datetime | None, Query()]


@router.get("/events", operation_id="listAuditEvents", response_model=AuditPage)
def list_events(
    ctx: Ctx, services: ServicesDep, actor: Actor = None, action: Action = None,
    object_type: ObjType = None, object_id: ObjId = None, outcome: OutcomeQ = None,
    since: When = None, until: When = None, q: Search = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    before_seq: Annotated[int | None, Query(ge=1, le=MAX_INT, description="cursor: records older than this")] = None,
) -> AuditPage:
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    rows, total, exact = services.audit.query(_filter(actor, action, object_type, object_id, outcome, since, until, q),
                                       limit=limit, before_seq=before_seq)
    return AuditPage(items=[_public(r) for r in rows], total=total, total_exact=exact,
                     next_before_seq=rows[-1].seq if len(rows) == limit else None)


@router.get("/events/{seq}", operation_id="getAuditEvent", response_model=AuditEventPublic)
def get_event(seq: Annotated[int, Path(ge=1, le=MAX_INT)], ctx: Ctx, services: ServicesDep) -> AuditEventPublic:
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    row = services.audit.get(seq)
    if row is None:
        raise NotFound(f"no audit record {seq}", code="audit_record_not_found")
    return _public(row)


@router.get("/export", operation_id="exportAudit", response_class=StreamingResponse,
            responses={200: {"content": {"text/csv": {}, "application/x-ndjson": {}}}})
def export(
    ctx: Ctx, services: ServicesDep, format: Annotated[Literal["csv", "jsonl"], Query()] = "jsonl",
    actor: Actor = None, action: Action = None, object_type: ObjType = None, object_id: ObjId = None,
    outcome: OutcomeQ = None, since: When = None, until: When = None, q: Search = None,
) -> StreamingResponse:
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.export")
    flt = _filter(actor, action, object_type, object_id, outcome, since, until, q)
    try:
        # Checked before the status line goes out: an invalid search answers 400, not a
        # 200 with a cut body. A failure later ends the body with an error line.
        pages = services.audit.export(flt, fmt=format)
    except InvalidInput as exc:
        services.audit.record_now(ctx, action="audit.export", outcome="denied",
                                  details={"format": format, "reason": exc.code})
        raise
    services.audit.record_now(ctx, action="audit.export", outcome="allowed", details={"format": format})
    media = "text/csv" if format == "csv" else "application/x-ndjson"
    return StreamingResponse(
        pages, media_type=media,
        headers={"Content-Disposition": f'attachment; filename="strongroom-audit.{format}"'},
    )


@router.post("/verify", operation_id="verifyAudit", response_model=VerifyResultPublic)
def verify(ctx: Ctx, services: ServicesDep, body: AuditVerifyRequest | None = None) -> VerifyResultPublic:
    """From the last verified checkpoint (or every record with `full`); with `outside`,
    also against a copy kept off the server: its checkpoints, and its records one by one."""
    services.policy.require(ctx, Permission.AUDIT_VERIFY, action="audit.verify")
    body = body or AuditVerifyRequest()
    # A record keeps the fields it was sent with (null ones too: they are part of its MAC).
    result = services.audit.verify(full=body.full, outside=[c.model_dump() for c in body.outside])
    services.audit.record_now(ctx, action="audit.verify", outcome="allowed",
                              details={"ok": result.ok, "checked": result.checked, "from_seq": result.from_seq,
                                       "outside": result.outside_checked,
                                       "outside_records": result.outside_records,
                                       "first_broken_seq": result.first_broken_seq})
    return VerifyResultPublic(ok=result.ok, checked=result.checked, head_seq=result.head_seq,
                              first_broken_seq=result.first_broken_seq, reason=result.reason,
                              from_seq=result.from_seq, checkpoint=result.checkpoint,
                              outside_checked=result.outside_checked, outside_records=result.outside_records,
                              outside_seq=result.outside_seq, statements=result.statements,
                              problems=[AuditVerifyProblem(seq=seq, reason=what) for seq, what in result.problems])


@router.get("/activity", operation_id="getAuditActivity", response_model=AuditActivity)
def activity(
    ctx: Ctx, services: ServicesDep,
    since: Annotated[datetime, Query(description="start, with a time zone; rounded down to the bucket")],
    until: Annotated[datetime, Query(description="end (exclusive), with a time zone")],
    bucket: Annotated[Literal["hour", "day"], Query()] = "hour",
    top: Annotated[int, Query(ge=1, le=20)] = 5,
) -> AuditActivity:
    """Records per hour or day by outcome, and who and what was refused most: read from
    hourly counts the chainer keeps, so as fast at millions of records as at a thousand
    (at most 400 buckets)."""
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    return AuditActivity(**services.audit.activity(since=since, until=until, bucket=bucket, top=top), bucket=bucket)


@router.get("/usage", operation_id="getKeyUsage", response_model=KeyUsage)
def usage(
    ctx: Ctx, services: ServicesDep,
    since: Annotated[datetime, Query(description="start, with a time zone; rounded down to the bucket")],
    until: Annotated[datetime, Query(description="end (exclusive), with a time zone")],
    key_id: Annotated[uuid.UUID | None, Query(description="one key's usage, with its top actors")] = None,
    actor: Annotated[str | None, Query(max_length=300, description=(
        "one actor's usage ('host:<hostname>', 'kmip:<client>', a user), with its top keys"))] = None,
    bucket: Annotated[Literal["hour", "day"], Query()] = "hour",
    top: Annotated[int, Query(ge=1, le=20)] = 5,
) -> KeyUsage:
    """Allowed operations on keys over time by action — for one key or one actor — from
    hourly counts the chainer keeps (at most 400 buckets)."""
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    return KeyUsage(**services.audit.usage(since=since, until=until, bucket=bucket, top=top,
                                           key_id=str(key_id) if key_id else None, actor=actor), bucket=bucket)


@router.get("/status", operation_id="getAuditStatus", response_model=AuditStatusPublic)
def status(ctx: Ctx, services: ServicesDep) -> AuditStatusPublic:
    """The chain's head, its last signed checkpoint and how far it was last verified,
    without walking the chain."""
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    st = services.audit.status()
    return AuditStatusPublic(**st, public_key_pem=services.audit.public_key_pem())


@router.get("/checkpoints", operation_id="listAuditCheckpoints", response_model=list[AuditCheckpointPublic])
def checkpoints(ctx: Ctx, services: ServicesDep,
                after: Annotated[int, Query(ge=0, le=2**62, description="checkpoints numbered after this")] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 1000) -> list[AuditCheckpointPublic]:
    """Signed checkpoints, oldest first: keep a copy off the server to verify against."""
    services.policy.require(ctx, Permission.AUDIT_READ, action="audit.read")
    return [AuditCheckpointPublic(**c) for c in services.audit.checkpoints(after=after, limit=limit)]
