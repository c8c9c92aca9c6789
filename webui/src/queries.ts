// Query keys and fetchers shared by the pages (TanStack Query).
import { useQuery } from "@tanstack/react-query";
import { api, call, type KeyState } from "./api/client";

export type KeySort = "name" | "-name" | "owner" | "-owner" | "created_at" | "-created_at" | "updated_at" | "-updated_at"
  | "next_rotation_at" | "-next_rotation_at";
export interface KeyFilter { q?: string; state?: KeyState; tag?: string; limit: number; offset: number; sort?: KeySort }

export type HostSort = "hostname" | "-hostname" | "host_group" | "-host_group" | "enrolled_at" | "-enrolled_at"
  | "last_heartbeat_at" | "-last_heartbeat_at" | "agent_version" | "-agent_version";
export type HostStatusFilter = "online" | "offline" | "revoked";
export interface HostFilter {
  q?: string; group?: string; status?: HostStatusFilter; sort?: HostSort; limit: number; offset: number;
}

export const qk = {
  keys: (f: KeyFilter) => ["keys", "list", f] as const,
  keysAll: ["keys"] as const,
  key: (ref: string) => ["keys", "one", ref] as const,
  audit: (f: object) => ["audit", "list", f] as const,
  auditAll: ["audit"] as const,
  users: ["users"] as const,
  tokens: (all: boolean) => ["tokens", all] as const,
  tokensAll: ["tokens"] as const,
  hostsAll: ["hosts"] as const,
  hosts: (f: HostFilter) => ["hosts", "list", f] as const,
  hostLists: ["hosts", "list"] as const,
  host: (id: string) => ["hosts", "one", id] as const,
  enrollmentTokens: ["enrollment-tokens"] as const,
  enrollmentInfo: ["enrollment-info"] as const,
  kek: ["system", "kek"] as const,
  health: ["system", "health"] as const,
};

/** Hosts report every heartbeat interval (30 s by default): keep their status current. */
const HOSTS_REFRESH_MS = 30_000;

export function useKeys(f: KeyFilter, enabled = true) {
  return useQuery({
    queryKey: qk.keys(f),
    queryFn: () => call(api.GET("/api/v1/keys", { params: { query: {
      q: f.q || undefined, state: f.state || undefined, tag: f.tag || undefined, limit: f.limit, offset: f.offset,
      sort: f.sort,
    } } })),
    placeholderData: (prev) => prev,
    enabled,
  });
}

export function useKey(ref: string) {
  return useQuery({
    queryKey: qk.key(ref),
    queryFn: () => call(api.GET("/api/v1/keys/{key_ref}", { params: { path: { key_ref: ref } } })),
  });
}

/** The fleet at a glance (dashboard, pickers): the first 500 hosts by name, with the
 *  counts per status of all of them. */
export function useHosts(enabled = true) {
  return useHostList({ limit: 500, offset: 0 }, enabled);
}

export function useHostList(f: HostFilter, enabled = true) {
  return useQuery({
    queryKey: qk.hosts(f),
    queryFn: () => call(api.GET("/api/v1/hosts", { params: { query: {
      q: f.q || undefined, group: f.group || undefined, status: f.status, sort: f.sort, limit: f.limit, offset: f.offset,
    } } })),
    placeholderData: (prev) => prev,
    refetchInterval: HOSTS_REFRESH_MS,
    enabled,
  });
}

export function useHost(id: string) {
  return useQuery({
    queryKey: qk.host(id),
    queryFn: () => call(api.GET("/api/v1/hosts/{host_id}", { params: { path: { host_id: id } } })),
    refetchInterval: HOSTS_REFRESH_MS,
  });
}

export function useEnrollmentTokens(enabled = true) {
  return useQuery({
    queryKey: qk.enrollmentTokens,
    queryFn: () => call(api.GET("/api/v1/enrollment-tokens")),
    enabled,
  });
}

export function useEnrollmentInfo(enabled = true) {
  return useQuery({
    queryKey: qk.enrollmentInfo,
    queryFn: () => call(api.GET("/api/v1/enrollment-info")),
    staleTime: 5 * 60_000,
    enabled,
  });
}

/** The audit chain's head, last checkpoint and verification (cheap: never re-walks it). */
export function useAuditStatus(enabled = true) {
  return useQuery({
    queryKey: ["audit", "status"],
    queryFn: () => call(api.GET("/api/v1/audit/status")),
    staleTime: 30_000,
    enabled,
  });
}
