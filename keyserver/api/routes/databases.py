"""Database identities: databases that read their encryption keys from the KV-v2
compatible front (routes/kv.py), the keys granted to them, and who uses a key.
Behaviour and rules: keyserver/core/integrations.py; guide: docs/integrations.md."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import Page
from keyserver.core.integrations import MAX_KV_ID, Consumer, DatabaseRecord, GrantRecord, IssuedDatabase
from keyserver.services import Services

router = APIRouter(tags=["databases"])
KV_MOUNT = "strongroom"  # the KV mount name in vault_url (routes/kv.py)
DbName = Annotated[str, Path(max_length=64, description="the database identity's name")]
KvId = Annotated[int, Path(ge=1, le=MAX_KV_ID, description="the database's numeric key id")]


class GrantPublic(BaseModel):
    key_id: int = Field(description="the database's numeric key id (1..4294967295)")
    key_name: str
    key_uuid: uuid.UUID
    granted_at: datetime
    granted_by: str
    last_read_at: datetime | None
    last_read_version: int | None


class DatabasePublic(BaseModel):
    id: uuid.UUID
    name: str
    description: str
    kind: Literal["mariadb"]
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    revoked_at: datetime | None
    grants: list[GrantPublic]


class DatabaseCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64,
                      description="lower-case letters, digits, '.', '_' or '-'; also the audit actor database:<name>")
    description: str = Field(default="", max_length=1000)
    kind: Literal["mariadb"] = "mariadb"


class DatabaseIssued(BaseModel):
    database: DatabasePublic
    token: str = Field(description="the database's KV token (X-Vault-Token); shown once")
    vault_url: str = Field(description="the KV mount URL the database is configured with")
    config: str = Field(description="a ready-to-paste my.cnf [mariadb] section")


class GrantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=128, description="the managed key's name or id")
    key_id: int = Field(ge=1, le=MAX_KV_ID, description="the numeric key id the database asks for (1: MariaDB's "
                                                        "default for tables, redo log and temporary files)")


class ConsumerPublic(BaseModel):
    kind: Literal["database", "kmip-client"]
    name: str
    detail: str
    last_used_at: datetime | None


class ConsumerList(BaseModel):
    items: list[ConsumerPublic]


def grant_public(g: GrantRecord) -> GrantPublic:
    return GrantPublic(key_id=g.key_id, key_name=g.key_name, key_uuid=g.key_uuid, granted_at=g.granted_at,
                       granted_by=g.granted_by, last_read_at=g.last_read_at, last_read_version=g.last_read_version)


def database_public(d: DatabaseRecord) -> DatabasePublic:
    return DatabasePublic(id=d.id, name=d.name, description=d.description, kind="mariadb", created_at=d.created_at,
                          created_by=d.created_by, last_seen_at=d.last_seen_at, revoked_at=d.revoked_at,
                          grants=[grant_public(g) for g in d.grants])


def vault_url(services: Services) -> str:
    return f"{services.settings.url}/v1/{KV_MOUNT}"


def mariadb_config(url: str, token: str) -> str:
    """The my.cnf section for MariaDB's hashicorp_key_management plugin (docs/integrations.md)."""
    return "\n".join((
        "[mariadb]",
        "plugin-load-add = hashicorp_key_management",
        f"hashicorp-key-management-vault-url = {url}",
        f"hashicorp-key-management-token = {token}",
        "# the key server's CA (GET /ca.pem on the REST port), when its certificate is not publicly trusted",
        "hashicorp-key-management-vault-ca = /etc/mysql/strongroom-ca.pem",
        "# keep running on cached keys while the key server cannot be reached",
        "hashicorp-key-management-caching-enabled = on",
        "hashicorp-key-management-use-cache-on-timeout = on",
        "innodb_encrypt_tables = ON",
        "innodb_encrypt_log = ON",
        "innodb_encrypt_temporary_tables = ON",
        "encrypt_tmp_files = ON",
        "encrypt_binlog = ON",
        "innodb_encryption_threads = 4",
        "# re-encrypt pages once the key is this many versions behind (1: after every rotation)",
        "innodb_encryption_rotate_key_age = 1",
        "",
    ))


def issued(services: Services, out: IssuedDatabase) -> DatabaseIssued:
    url = vault_url(services)
    return DatabaseIssued(database=database_public(out.database), token=out.token, vault_url=url,
                          config=mariadb_config(url, out.token))


@router.get("/databases", operation_id="listDatabases", response_model=Page[DatabasePublic])
def list_databases(ctx: Ctx, services: ServicesDep) -> Page[DatabasePublic]:
    rows = services.databases.list_all(ctx)
    return Page(items=[database_public(d) for d in rows], total=len(rows), limit=len(rows), offset=0)


@router.post("/databases", operation_id="createDatabase", response_model=DatabaseIssued, status_code=201)
def create_database(body: DatabaseCreate, ctx: Ctx, services: ServicesDep) -> DatabaseIssued:
    """A database identity and its KV token (shown once), with the my.cnf section to paste."""
    return issued(services, services.databases.create(ctx, name=body.name, description=body.description,
                                                      kind=body.kind))


@router.get("/databases/{name}", operation_id="getDatabase", response_model=DatabasePublic)
def get_database(name: DbName, ctx: Ctx, services: ServicesDep) -> DatabasePublic:
    return database_public(services.databases.get(ctx, name))


@router.post("/databases/{name}/token", operation_id="reissueDatabaseToken", response_model=DatabaseIssued)
def reissue_database_token(name: DbName, ctx: Ctx, services: ServicesDep) -> DatabaseIssued:
    """A new token; the old one is refused from now on."""
    return issued(services, services.databases.reissue_token(ctx, name))


@router.post("/databases/{name}/revoke", operation_id="revokeDatabase", response_model=DatabasePublic)
def revoke_database(name: DbName, ctx: Ctx, services: ServicesDep) -> DatabasePublic:
    """Its token is refused at once; every read is refused and audited."""
    return database_public(services.databases.revoke(ctx, name))


@router.post("/databases/{name}/grants", operation_id="grantDatabaseKey", response_model=GrantPublic,
             status_code=201)
def grant_database_key(name: DbName, body: GrantCreate, ctx: Ctx, services: ServicesDep) -> GrantPublic:
    """Let the database read a managed AES key under a numeric key id. The key's material
    leaves in plaintext at each read: needs keys:export too, and waits for approval (202)
    when the two-person rule holds `database.grant`."""
    return grant_public(services.databases.grant(ctx, name, key=body.key, key_id=body.key_id))


@router.delete("/databases/{name}/grants/{key_id}", operation_id="revokeDatabaseGrant", status_code=204,
               response_class=Response)
def revoke_database_grant(name: DbName, key_id: KvId, ctx: Ctx, services: ServicesDep) -> Response:
    services.databases.ungrant(ctx, name, key_id)
    return Response(status_code=204)


@router.get("/keys/{key_ref}/consumers", operation_id="listKeyConsumers", response_model=ConsumerList)
def list_key_consumers(key_ref: str, ctx: Ctx, services: ServicesDep) -> ConsumerList:
    """The databases granted this key and the KMIP clients that used any of its versions
    (from the audit chain's hourly usage counts; a use appears once its record is chained)."""
    return ConsumerList(items=[consumer_public(c) for c in services.databases.consumers(ctx, key_ref)])


def consumer_public(c: Consumer) -> ConsumerPublic:
    return ConsumerPublic(kind=c.kind, name=c.name, detail=c.detail, last_used_at=c.last_used_at)  # type: ignore[arg-type]
