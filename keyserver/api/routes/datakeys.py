from __future__ import annotations

import base64

from fastapi import APIRouter

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import BlobRequest, DataKeyPublic

router = APIRouter(prefix="/datakeys", tags=["data keys"])


@router.post("/decrypt", operation_id="decryptDataKey", response_model=DataKeyPublic)
def decrypt(body: BlobRequest, ctx: Ctx, services: ServicesDep) -> DataKeyPublic:
    dk = services.datakeys.decrypt(ctx, body.ciphertext_blob, context=body.context)
    assert dk.plaintext is not None
    return DataKeyPublic(key_id=dk.key_id, key_name=dk.key_name, key_version=dk.key_version,
                         ciphertext_blob=base64.b64encode(dk.blob).decode(),
                         plaintext=base64.b64encode(dk.plaintext).decode())


@router.post("/reencrypt", operation_id="reencryptDataKey", response_model=DataKeyPublic)
def reencrypt(body: BlobRequest, ctx: Ctx, services: ServicesDep) -> DataKeyPublic:
    dk = services.datakeys.reencrypt(ctx, body.ciphertext_blob, context=body.context)
    return DataKeyPublic(key_id=dk.key_id, key_name=dk.key_name, key_version=dk.key_version,
                         ciphertext_blob=base64.b64encode(dk.blob).decode(), plaintext=None)
