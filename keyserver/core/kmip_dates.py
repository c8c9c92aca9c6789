"""KMIP's objects other than key versions follow their Activation and Deactivation Dates
(the scheduler's turn, KeyService.run_due)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService
from keyserver.core.principal import RequestContext
from keyserver.core.states import KeyState
from keyserver.store.models import KmipPublicKey, KmipSealedObject
from keyserver.store.notify import Notifier, Topic


def objects_due(db: sessionmaker[Session], audit: AuditService, notifier: Notifier, ctx: RequestContext,
                now: datetime) -> tuple[int, int]:
    """KMIP's other objects (key pairs' halves, secret data, certificates) follow
    their Activation and Deactivation Dates like key versions do."""
    activated = deactivated = 0
    models: tuple[type[KmipPublicKey] | type[KmipSealedObject], ...] = (KmipPublicKey, KmipSealedObject)
    for model in models:
        with db() as s:
            due = list(s.execute(select(model.id).where(or_(
                (model.state == KeyState.PRE_ACTIVE.value) & (model.activation_date <= now),
                model.state.in_([KeyState.PRE_ACTIVE.value, KeyState.ACTIVE.value])
                & (model.deactivation_date <= now)))).scalars())
        for object_id in due:
            with db.begin() as s:
                row = (s.get(KmipPublicKey, object_id, with_for_update=True) if model is KmipPublicKey
                       else s.get(KmipSealedObject, object_id, with_for_update=True))
                if row is None:
                    continue
                current = KeyState(row.state)
                if (current in (KeyState.PRE_ACTIVE, KeyState.ACTIVE) and row.deactivation_date is not None
                        and row.deactivation_date <= now):
                    target, action = KeyState.DEACTIVATED, "kmip.deactivate"
                elif (current is KeyState.PRE_ACTIVE and row.activation_date is not None
                      and row.activation_date <= now):
                    target, action = KeyState.ACTIVE, "kmip.activate"
                else:
                    continue  # changed since it was selected
                row.state = target.value
                if isinstance(row, KmipSealedObject):
                    row.updated_at = now
                notifier.publish(s, Topic.KEYS)  # replicas drop what Get cached of it
                object_type = row.object_type if isinstance(row, KmipSealedObject) else "public-key"
                audit.add(s, ctx, action=action, object_type=object_type.replace("-", "_"),
                                object_id=str(row.id), details={"state": target.value, "from": current.value,
                                                                "by_date": True})
            if target is KeyState.ACTIVE:
                activated += 1
            else:
                deactivated += 1
    return activated, deactivated
