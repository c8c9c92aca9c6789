// Databases that read their encryption keys from Strongroom (MariaDB through the Vault KV
// version 2 API, docs/integrations.md): the calls, query keys and rules the pages share,
// kept apart from rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { api, call, type Schemas } from "./api/client";

export type Grant = Schemas["GrantPublic"];
export type Database = Schemas["DatabasePublic"];
export type DatabaseIssued = Schemas["DatabaseIssued"];
export type Consumer = Schemas["ConsumerPublic"];

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

const byName = (name: string) => ({ params: { path: { name } } });

export const databasesApi = {
  list: () => call(api.GET("/api/v1/databases")),
  get: (name: string) => call(api.GET("/api/v1/databases/{name}", byName(name))),
  create: (body: { name: string; description: string }) => call(api.POST("/api/v1/databases", { body })),
  reissue: (name: string) => call(api.POST("/api/v1/databases/{name}/token", byName(name))),
  revoke: (name: string) => call(api.POST("/api/v1/databases/{name}/revoke", byName(name))),
  /** 201 with the grant, or 202 with the approval request when the two-person rule holds it. */
  grant: (name: string, body: { key: string; key_id: number }) =>
    call(api.POST("/api/v1/databases/{name}/grants", { ...byName(name), body })),
  removeGrant: (name: string, keyId: number) =>
    call(api.DELETE("/api/v1/databases/{name}/grants/{key_id}", { params: { path: { name, key_id: keyId } } })),
  consumers: (key: string) => call(api.GET("/api/v1/keys/{key_ref}/consumers", { params: { path: { key_ref: key } } })),
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
