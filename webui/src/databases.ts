// Databases that read their encryption keys from Strongroom (MariaDB through the Vault KV
// version 2 API, docs/integrations.md): the calls, query keys and rules the pages share,
// kept apart from rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { api, call } from "./api/client";

// ---- The contract (keyserver/api/routes/databases.py). Declared here until the generated
// schema.ts has these paths; then these become Schemas["…"] aliases.
export interface Grant {
  key_id: number; key_name: string; key_uuid: string; granted_at: string; granted_by: string;
  last_read_at: string | null; last_read_version: number | null;
}
export interface Database {
  id: string; name: string; description: string; kind: "mariadb"; created_at: string; created_by: string;
  last_seen_at: string | null; revoked_at: string | null; grants: Grant[];
}
export interface DatabasePage { items: Database[]; total: number; limit: number; offset: number }
export interface DatabaseIssued { database: Database; token: string; vault_url: string; config: string }
export interface Consumer { kind: "database" | "kmip-client"; name: string; detail: string; last_used_at: string | null }
export interface Held { status: "pending"; code: string; detail: string }
type Send = <T>(path: string, init?: object) => Promise<{ data?: T; error?: unknown; response: Response }>;
const raw = api as unknown as { GET: Send; POST: Send; DELETE: Send };
// ----

/** MariaDB's key ids are 32-bit unsigned; 0 is not a key. */
export const MAX_KEY_ID = 4_294_967_295;
/** innodb_default_encryption_key_id: what MariaDB asks for unless a table names another. */
export const DEFAULT_KEY_ID = 1;

export const dbq = {
  all: ["databases"] as const,
  list: ["databases", "list"] as const,
  one: (name: string) => ["databases", "one", name] as const,
  consumersAll: ["keys", "consumers"] as const,
  consumers: (key: string) => ["keys", "consumers", key] as const,
};

/** The console's page of a database. */
export const dbPath = (name: string) => `/databases/${encodeURIComponent(name)}`;

const at = (name: string) => `/api/v1/databases/${encodeURIComponent(name)}`;

export const databasesApi = {
  list: () => call<DatabasePage>(raw.GET("/api/v1/databases")),
  get: (name: string) => call<Database>(raw.GET(at(name))),
  create: (body: { name: string; description: string }) => call<DatabaseIssued>(raw.POST("/api/v1/databases", { body })),
  reissue: (name: string) => call<DatabaseIssued>(raw.POST(`${at(name)}/token`)),
  revoke: (name: string) => call<Database>(raw.POST(`${at(name)}/revoke`)),
  grant: (name: string, body: { key: string; key_id: number }) => call<Grant | Held>(raw.POST(`${at(name)}/grants`, { body })),
  removeGrant: (name: string, keyId: number) => call<void>(raw.DELETE(`${at(name)}/grants/${keyId}`)),
  consumers: (key: string) => call<{ items: Consumer[] }>(raw.GET(`/api/v1/keys/${encodeURIComponent(key)}/consumers`)),
};

/** Every database identity, by name (the server sends them all: one per database). */
export function useDatabases() {
  return useQuery({ queryKey: dbq.list, queryFn: databasesApi.list });
}

export function useDatabase(name: string) {
  return useQuery({ queryKey: dbq.one(name), queryFn: () => databasesApi.get(name) });
}

export function useKeyConsumers(key: string, enabled = true) {
  return useQuery({ queryKey: dbq.consumers(key), queryFn: () => databasesApi.consumers(key), enabled });
}

export type DatabaseState = "active" | "revoked";
export const databaseState = (d: Pick<Database, "revoked_at">): DatabaseState => (d.revoked_at ? "revoked" : "active");

/** Why a typed key id is not one MariaDB can ask for, or null when it is. Typed as text:
 *  nothing is rounded, clamped or cut on the way (a NumberInput would). */
export function keyIdError(text: string, taken: number[] = []): string | null {
  const t = text.trim();
  if (!t) return "Required: the number MariaDB asks for (1 is its default key)";
  if (!/^\d+$/.test(t)) return "A whole number from 1 to 4,294,967,295, digits only";
  const n = Number(t);
  if (n < 1 || n > MAX_KEY_ID) return "A whole number from 1 to 4,294,967,295 (MariaDB's key ids are 32-bit; 0 is not a key)";
  if (taken.includes(n)) return `Key id ${n} is granted already: remove that grant first, or choose another id`;
  return null;
}

/** The smallest key id this database does not use yet (1, MariaDB's default, when none). */
export function nextKeyId(grants: Pick<Grant, "key_id">[]): number {
  const used = new Set(grants.map((g) => g.key_id));
  let n = DEFAULT_KEY_ID;
  while (used.has(n)) n += 1;
  return n;
}
