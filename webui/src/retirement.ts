// Retiring a key version (decision 0024): the inventory of what still uses a version, the
// held retirement that moves every holder to the newest version, and destroy's refusal of
// a version in use. The calls, query keys and words the key page shares, kept apart from
// rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { ApiError, api, call, problemOf, type Key } from "./api/client";

export type HolderState = "in_use" | "clear" | "unreported" | "excluded";

export interface Holder {
  kind: string;
  holder: string;
  name: string;
  host?: string | null;
  count?: number | null;
  state: HolderState;
  reported_at?: string | null;
}

export interface Exclusion { kind: string; holder: string; reason: string; by?: string | null; excluded_by?: string | null; excluded_at?: string | null }

export interface Retirement {
  id: string;
  state: "running" | "complete" | "cancelled" | string;
  reason?: string;
  contents?: boolean;
  requested_by?: string | null;
  requested_at?: string | null;
  completed_at?: string | null;
  cancelled_at?: string | null;
  cancelled_by?: string | null;
  /** The seq of its `key.version_retired` record (the signed zero-use statement), once complete. */
  statement_seq?: number | null;
  /** The inventory's counts per kind when it began. */
  initial?: Record<string, number> | null;
  exclusions?: Exclusion[] | null;
}

export interface Inventory {
  key: string;
  key_id: string;
  version: number;
  state: string;
  in_use: boolean;
  computed_at: string;
  kinds: Record<string, number>;
  holders: Holder[];
  unreported_hosts: string[];
  retirement: Retirement | null;
}

/** 202: the server's words when the two-person rule held the request. */
export interface Held { status: "pending"; detail?: string }

// The counts' kinds and the holders' kinds, as a person names them.
export const KIND_LABEL: Record<string, string> = {
  data_keys: "Data keys",
  guard_point_files: "Guard-point files",
  volumes: "Volumes",
  databases: "Databases",
  xks_stores: "AWS key stores",
  kmip_clients: "KMIP clients",
  guard_point: "Guard point",
  volume: "Volume",
  database: "Database",
  xks_store: "AWS key store",
  kmip_client: "KMIP client",
};
export const kindLabel = (kind: string) => KIND_LABEL[kind] ?? kind.replace(/_/g, " ");

export const HOLDER_STATE: Record<HolderState, { color: string; label: string }> = {
  in_use: { color: "orange", label: "in use" },
  clear: { color: "teal", label: "clear" },
  unreported: { color: "red", label: "unreported" },
  excluded: { color: "gray", label: "excluded" },
};

/** A holder's count as a person reads it: null is "in use, count unknown" (a grant, a client). */
export function countText(h: Pick<Holder, "count" | "state">): string {
  if (h.count == null) return h.state === "in_use" ? "unknown" : "—";
  return h.count.toLocaleString("en");
}

/** How far a running retirement has come: the share of what it started with that has moved. */
export function progressOf(initial: Record<string, number> | null | undefined, now: Record<string, number>): number | null {
  if (!initial) return null;
  const start = Object.values(initial).reduce((a, b) => a + (b || 0), 0);
  if (start <= 0) return null;
  const left = Object.keys(initial).reduce((a, k) => a + Math.min(now[k] ?? 0, initial[k] || 0), 0);
  return Math.round(((start - left) / start) * 100);
}

export const rq = {
  all: ["keys", "retirement"] as const,
  inventory: (keyId: string, version: number) => ["keys", "retirement", keyId, version] as const,
};

/** While a retirement runs, hosts report and counts fall: follow it. */
const RUNNING_REFRESH_MS = 10_000;

type Loose = (path: string, init?: object) => Promise<{ data?: unknown; error?: unknown; response: Response }>;
// The retirement routes are newer than the generated schema the console was last built
// against: these calls go through the same client (cookies, CSRF, problem+json) untyped.
const loose = api as unknown as { GET: Loose; POST: Loose; DELETE: Loose };
const at = (key: string, version: number) => ({ params: { path: { key_ref: key, version } } });

export const retirementApi = {
  inventory: (key: string, version: number) =>
    call(loose.GET("/api/v1/keys/{key_ref}/versions/{version}/inventory", at(key, version))) as Promise<Inventory>,
  /** 202 with the approval request when the two-person rule holds it. */
  retire: (key: string, version: number, body: { reason: string; contents: boolean }) =>
    call(loose.POST("/api/v1/keys/{key_ref}/versions/{version}/retire", { ...at(key, version), body })) as Promise<unknown>,
  cancel: (key: string, version: number) =>
    call(loose.DELETE("/api/v1/keys/{key_ref}/versions/{version}/retire", at(key, version))) as Promise<unknown>,
  exclude: (key: string, version: number, body: { kind: string; holder: string; reason: string }) =>
    call(loose.POST("/api/v1/keys/{key_ref}/versions/{version}/retire/exclusions", { ...at(key, version), body })) as Promise<unknown>,
  /** Destroy one version (or every one, without `version`). Refused 409 version_in_use
   *  with the holders in use; `shred` destroys anyway, making what they hold unreadable. */
  destroy: async (key: string, body: { version?: number; shred?: boolean }): Promise<Key | Held> => {
    const r = await loose.POST("/api/v1/keys/{key_ref}/destroy", { params: { path: { key_ref: key } }, body })
      .catch(() => null);
    if (r && r.response.status === 409) {
      const err = await problemOf(r.response, r.error);
      if (err.code === "version_in_use") throw new VersionInUse(err, holdersOf(r.error));
      throw err;
    }
    return call(r ? Promise.resolve(r) : Promise.reject(new TypeError("network"))) as Promise<Key | Held>;
  },
};

/** The holders named in a version_in_use refusal's `errors`. */
export function holdersOf(body: unknown): Holder[] {
  const errors = (body && typeof body === "object" ? (body as { errors?: unknown }).errors : null);
  if (!Array.isArray(errors)) return [];
  return errors.filter((e): e is Holder => !!e && typeof e === "object" && typeof (e as Holder).kind === "string"
    && (typeof (e as Holder).name === "string" || typeof (e as Holder).holder === "string"))
    .map((e) => ({ ...e, name: e.name ?? e.holder, state: e.state ?? "in_use" }));
}

/** Destroy refused: the version still protects something. */
export class VersionInUse extends ApiError {
  readonly holders: Holder[];
  constructor(err: ApiError, holders: Holder[]) {
    super({ status: err.status, code: err.code, detail: err.detail, requestId: err.requestId, retryAfter: err.retryAfter,
            fields: { ...err.fields } });
    this.holders = holders;
  }
}

export function useInventory(keyId: string, version: number | null) {
  return useQuery({
    queryKey: rq.inventory(keyId, version ?? 0),
    queryFn: () => retirementApi.inventory(keyId, version ?? 0),
    enabled: version != null,
    refetchInterval: (q) => (q.state.data?.retirement?.state === "running" ? RUNNING_REFRESH_MS : false),
  });
}
