"""Key-encryption keys: RSA-2048 pairs kept as token objects."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pkcs11 import Attribute, KeyType, ObjectClass

from hsm import mechanisms
from hsm.backend import KekAttributes, KekInfo
from hsm.errors import HsmInvalidInput, HsmKeyNotFound
from hsm.pkcs11.common import Lease, check_id, refused
from hsm.pkcs11.core import Pkcs11Core

log = logging.getLogger(__name__)


class KekOps(Pkcs11Core):
    """Create, find, list, describe and destroy KEKs."""

    def create_kek(self, kek_id: str) -> KekInfo:
        check_id(kek_id, what="KEK id")

        def create(lease: Lease) -> KekInfo:
            session = lease.session
            if self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id) or self._find(
                session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id
            ):
                raise HsmInvalidInput(f"a KEK with id {kek_id!r} already exists")
            today = datetime.now(UTC).date()
            session.generate_keypair(
                KeyType.RSA,
                mechanisms.KEK_BITS,
                store=True,
                capabilities=0,
                public_template={
                    **mechanisms.kek_public_template(kek_id),
                    Attribute.START_DATE: today,
                },
                private_template=self._known({
                    **mechanisms.kek_private_template(kek_id),
                    Attribute.START_DATE: today,
                }),
            )
            log.info("created KEK %r in token %r", kek_id, self._label)
            return self._kek(session, kek_id).info

        # Check-then-create must not interleave within the process.
        with self._create_lock:
            return self._run("create_kek", create, on_crypto=refused)

    def get_kek(self, kek_id: str) -> KekInfo:
        check_id(kek_id, what="KEK id")
        return self._run("get_kek", lambda lease: self._kek(lease.session, kek_id).info)

    def list_keks(self) -> list[KekInfo]:
        def list_all(lease: Lease) -> list[KekInfo]:
            found = lease.session.get_objects(
                {
                    Attribute.CLASS: ObjectClass.PUBLIC_KEY,
                    Attribute.KEY_TYPE: KeyType.RSA,
                    Attribute.TOKEN: True,
                    Attribute.WRAP: True,
                }
            )
            ids = set()
            for obj in found:
                raw_id, label = obj[Attribute.ID], obj[Attribute.LABEL]
                # Ours are labelled with their id; other RSA keys on a shared token are not.
                if raw_id and raw_id == label.encode("utf-8"):
                    ids.add(label)
            keks = []
            for kek_id in sorted(ids):
                try:
                    keks.append(self._kek(lease.session, kek_id).info)
                except HsmKeyNotFound:
                    continue  # a public half without its private half is not a KEK
            return keks

        return self._run("list_keks", list_all)

    def describe_kek(self, kek_id: str) -> KekAttributes:
        check_id(kek_id, what="KEK id")

        def describe(lease: Lease) -> KekAttributes:
            session = lease.session
            public = self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id)
            private = self._find(session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id)
            if public is None or private is None:
                raise HsmKeyNotFound(f"KEK {kek_id!r} not found in token {self._label!r}")
            pub = public.get_attributes(
                [Attribute.MODULUS_BITS, Attribute.MODULUS, Attribute.WRAP, Attribute.ENCRYPT]
            )
            prv = private.get_attributes(
                [
                    Attribute.SENSITIVE,
                    Attribute.ALWAYS_SENSITIVE,
                    Attribute.EXTRACTABLE,
                    Attribute.NEVER_EXTRACTABLE,
                    Attribute.UNWRAP,
                    Attribute.DECRYPT,
                    Attribute.SIGN,
                ]
            )
            return KekAttributes(
                kek_id=kek_id,
                modulus_bits=int(pub.get(Attribute.MODULUS_BITS) or len(pub[Attribute.MODULUS]) * 8),
                private_sensitive=bool(prv[Attribute.SENSITIVE]),
                private_always_sensitive=bool(prv[Attribute.ALWAYS_SENSITIVE]),
                private_extractable=bool(prv[Attribute.EXTRACTABLE]),
                private_never_extractable=bool(prv[Attribute.NEVER_EXTRACTABLE]),
                private_unwrap=bool(prv[Attribute.UNWRAP]),
                private_decrypt=bool(prv[Attribute.DECRYPT]),
                private_sign=bool(prv[Attribute.SIGN]),
                public_wrap=bool(pub[Attribute.WRAP]),
                public_encrypt=bool(pub[Attribute.ENCRYPT]),
            )

        return self._run("describe_kek", describe)


    def destroy_kek(self, kek_id: str) -> None:
        check_id(kek_id, what="KEK id")

        def destroy(lease: Lease) -> None:
            session = lease.session
            halves = [obj for obj in (self._find(session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id),
                                      self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id))
                      if obj is not None]
            if not halves:
                raise HsmKeyNotFound(f"KEK {kek_id!r} not found in token {self._label!r}")
            for obj in halves:  # the private half first: a lone public half can wrap but never unwrap
                obj.destroy()
            log.warning("destroyed KEK %r in token %r", kek_id, self._label)

        with self._create_lock:
            self._run("destroy_kek", destroy, on_crypto=refused)
        with self._handles_lock:
            self._keks.pop(kek_id, None)
        # Handles unwrapped under it are plain session copies that would outlive it; dropping
        # them all is simpler than finding which (the next use re-unwraps the re-wrapped blob).
        self._cache.clear()
