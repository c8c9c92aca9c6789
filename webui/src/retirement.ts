// Retiring a key version (decision 0024): the inventory of what still uses a version, the
// held retirement that moves every holder to the newest version, and destroy's refusal of
// a version in use. The calls, query keys and words the key page shares, kept apart from
// rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { ApiError, api, call, type Key, type Schemas } from "./api/client";

export type Holder = Schemas["Holder"];
export type HolderState = Holder["state"];
export type Exclusion = Schemas["Exclusion"];
export type Retirement = Schemas["Retirement"];
export type Inventory = Schemas["Inventory"];
/** What an exclusion names: a holder's kind, or `host` (every guard point and volume of a host). */
export type ExclusionKind = Schemas["ExclusionRequest"]["kind"];

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

/** Guard points whose last walk found files naming no version of the key (damaged, another
 *  key's): no version decrypts them, so they block nothing, but the statement names them. */
export function unreadableHolders(holders: Holder[]): (Holder & { unreadable: number })[] {
  return holders.filter((h): h is Holder & { unreadable: number } => h.kind === "guard_point" && (h.unreadable ?? 0) > 0);
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
  list: ["keys", "retirement", "list"] as const,
  inventory: (keyId: string, version: number) => ["keys", "retirement", keyId, version] as const,
};

/** While a retirement runs, hosts report and counts fall: follow it. */
const RUNNING_REFRESH_MS = 10_000;

const at = (key: string, version: number) => ({ params: { path: { key_ref: key, version } } });

export const retirementApi = {
  list: () => call(api.GET("/api/v1/retirements")),
  inventory: (key: string, version: number) =>
    call(api.GET("/api/v1/keys/{key_ref}/versions/{version}/inventory", at(key, version))),
  /** 201 with the retirement, or 202 with the approval request when the two-person rule holds it. */
  retire: (key: string, version: number, body: { reason: string; contents: boolean }) =>
    call(api.POST("/api/v1/keys/{key_ref}/versions/{version}/retire", { ...at(key, version), body })),
  cancel: (key: string, version: number) =>
    call(api.DELETE("/api/v1/keys/{key_ref}/versions/{version}/retire", at(key, version))),
  exclude: (key: string, version: number, body: { kind: ExclusionKind; holder: string; reason: string }) =>
    call(api.POST("/api/v1/keys/{key_ref}/versions/{version}/retire/exclusions", { ...at(key, version), body })),
  /** Destroy one version (or every one, without `version`): the key, or 202 when held. Refused
   *  409 version_in_use with the holders in use; `shred` destroys anyway, making what they
   *  hold unreadable. */
  destroy: async (key: string, body: { version?: number; shred?: boolean }): Promise<Key | Held> => {
    let refused: RefusedHolder[] | null = null;
    const sent = api.POST("/api/v1/keys/{key_ref}/destroy", { params: { path: { key_ref: key } }, body })
      .then((r) => { if (r.response.status === 409) refused = holdersOf(r.error); return r; });
    try {
      return await call(sent);
    } catch (e) {
      if (e instanceof ApiError && e.code === "version_in_use") throw new VersionInUse(e, refused ?? []);
      throw e;
    }
  },
};

/** A holder in a version_in_use refusal: the version it holds comes with it. */
export type RefusedHolder = Holder & { version?: number };

/** The holders named in a version_in_use refusal's `errors`. */
export function holdersOf(body: unknown): RefusedHolder[] {
  const errors = (body && typeof body === "object" ? (body as { errors?: unknown }).errors : null);
  if (!Array.isArray(errors)) return [];
  return errors.filter((e): e is RefusedHolder => !!e && typeof e === "object" && typeof (e as Holder).kind === "string"
    && (typeof (e as Holder).name === "string" || typeof (e as Holder).holder === "string"))
    .map((e) => ({ ...e, name: e.name ?? e.holder, state: e.state ?? "in_use", host: e.host ?? null,
                   count: e.count ?? null, unreadable: e.unreadable ?? null, reported_at: e.reported_at ?? null }));
}

/** Destroy refused: the version still protects something. */
export class VersionInUse extends ApiError {
  readonly holders: RefusedHolder[];
  constructor(err: ApiError, holders: RefusedHolder[]) {
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

/** Every retirement the server knows (it sends them all, newest first or not): those of
 *  one key, the latest per version, for its Versions panel. */
export function useKeyRetirements(keyId: string) {
  return useQuery({
    queryKey: rq.list,
    queryFn: retirementApi.list,
    select: (all) => latestPerVersion(all.filter((r) => r.key_id === keyId)),
    refetchInterval: (q) => (q.state.data?.some((r) => r.state === "running") ? RUNNING_REFRESH_MS : false),
  });
}

export function latestPerVersion(items: Retirement[]): Record<number, Retirement> {
  const out: Record<number, Retirement> = {};
  for (const r of items) {
    const seen = out[r.version];
    if (!seen || r.requested_at > seen.requested_at) out[r.version] = r;
  }
  return out;
}
