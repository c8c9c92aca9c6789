// KMIP tenancy (docs/kmip.md "Tenancy"): each KMIP client belongs to a group and sees its
// group's objects plus what a grant gives it. The calls, query keys and rules the KMIP page
// and a key's page share, kept apart from rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { api, call, type Schemas } from "./api/client";

export type KmipGroup = Schemas["KmipGroup"];
export type KmipGrant = Schemas["KmipGrant"];
export type KmipRight = KmipGrant["rights"][number];
export type KmipGrantCreate = Schemas["KmipGrantCreate"];

export const kq = {
  groups: ["kmip-groups"] as const,
  grantsAll: ["kmip-grants"] as const,
  grants: (f: GrantFilter) => ["kmip-grants", f] as const,
};

export interface GrantFilter { grantee?: string; key?: string; group?: string }

export const kmipApi = {
  groups: () => call(api.GET("/api/v1/kmip/groups")),
  grants: (f: GrantFilter) => call(api.GET("/api/v1/kmip/grants", { params: { query: {
    grantee: f.grantee || undefined, key: f.key || undefined, group: f.group || undefined } } })),
  grant: (body: KmipGrantCreate) => call(api.POST("/api/v1/kmip/grants", { body })),
  revokeGrant: (id: string) => call(api.DELETE("/api/v1/kmip/grants/{grant_id}", { params: { path: { grant_id: id } } })),
};

export function useKmipGroups(enabled = true) {
  return useQuery({ queryKey: kq.groups, queryFn: kmipApi.groups, enabled });
}

export function useKmipGrants(f: GrantFilter = {}, enabled = true) {
  return useQuery({ queryKey: kq.grants(f), queryFn: () => kmipApi.grants(f), enabled });
}

/** As the server checks a group name (keyserver/core/names.py GROUP_RE): 1-64 characters of
 *  [a-z0-9._-], starting with a letter or digit. */
export const GROUP_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
export const GROUP_MAX = 64;

/** Why a typed group name is not one the server takes, or null when it is (or is empty: the
 *  callers decide whether empty means "the default" or "none"). */
export function groupError(text: string): string | null {
  const t = text.trim();
  if (!t) return null;
  if ([...t].length > GROUP_MAX) return `At most ${GROUP_MAX} characters; this one has ${[...t].length}`;
  if (GROUP_RE.test(t)) return null;
  if (t !== t.toLowerCase() && GROUP_RE.test(t.toLowerCase())) return `Lower case only: ${t.toLowerCase()}`;
  if (!/^[a-z0-9]/.test(t)) return "Starts with a lower-case letter or digit";
  const bad = [...new Set([...t].filter((c) => !/[a-z0-9._-]/.test(c)))].map((c) => (c === " " ? "a space" : `"${c}"`));
  return `Lower-case letters, digits, dots, hyphens and underscores only (not ${bad.join(", ")})`;
}

/** The audit log's object types of standalone KMIP objects (keyserver/core/kmip_model.py
 *  audit_identity): each may be granted by its unique identifier, the record's object ID. */
export const STANDALONE_OBJECT_TYPES = new Set(["public_key", "private_key", "secret_data", "certificate", "opaque_object"]);

/** A standalone KMIP object's unique identifier as the server takes it (keyserver/core/names.py
 *  UUID_RE): 32 hexadecimal digits, hyphens optional. */
const OBJECT_UID_RE = /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i;

/** Why typed text is not a unique identifier the server could know, or null when it is. */
export function objectUidError(text: string): string | null {
  const t = text.trim();
  if (!t) return "Required: the object's unique identifier";
  if (OBJECT_UID_RE.test(t)) return null;
  const hex = t.replace(/-/g, "");
  if (/[^0-9a-f]/i.test(hex)) {
    return "A unique identifier has hexadecimal digits (0-9, a-f) and hyphens only, as 0b8e2f5a-4c3d-4e1f-9a7b-6c5d4e3f2a1b";
  }
  return `A unique identifier has 32 hexadecimal digits; this one has ${hex.length}`;
}

/** The identifier as the server writes it in a grant (lower case, hyphenated), so that a
 *  grant already made is recognised however the identifier was typed. */
export function toObjectUid(text: string): string {
  const h = text.trim().replace(/-/g, "").toLowerCase();
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** What each right lets a KMIP client do (docs/kmip.md "Tenancy"), in the order shown. */
export const RIGHTS: { value: KmipRight; label: string; help: string; color: string }[] = [
  { value: "read", label: "read", help: "Locate it and read its attributes", color: "blue" },
  { value: "use", label: "use", help: "Encrypt, decrypt, sign, verify and MAC with it, inside the server", color: "teal" },
  { value: "export", label: "export", help: "Get the key material, still limited by the client's key export setting", color: "orange" },
  { value: "destroy", label: "destroy", help: "Revoke and destroy it", color: "red" },
];
const RIGHT_ORDER = RIGHTS.map((r) => r.value);
export const sortRights = (rights: readonly KmipRight[]) =>
  [...rights].sort((a, b) => RIGHT_ORDER.indexOf(a) - RIGHT_ORDER.indexOf(b));

/** "client:backup-01" → { kind: "client", name: "backup-01" }. */
export function parseGrantee(grantee: string): { kind: "client" | "group"; name: string } {
  const i = grantee.indexOf(":");
  const kind = grantee.slice(0, i);
  return { kind: kind === "group" ? "group" : "client", name: i < 0 ? grantee : grantee.slice(i + 1) };
}

/** The console's view of the KMIP page, with what to open on it. */
export const kmipPath = (view: "clients" | "groups" | "grants", extra: Record<string, string> = {}) => {
  const q = new URLSearchParams(view === "clients" ? extra : { view, ...extra }).toString();
  return `/kmip-clients${q ? `?${q}` : ""}`;
};
