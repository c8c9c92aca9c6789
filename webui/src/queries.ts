// Query keys and fetchers shared by the pages (TanStack Query).
import { useQuery } from "@tanstack/react-query";
import { api, call, type KeyState } from "./api/client";

export interface KeyFilter { q?: string; state?: KeyState; tag?: string; limit: number; offset: number }

export const qk = {
  keys: (f: KeyFilter) => ["keys", "list", f] as const,
  keysAll: ["keys"] as const,
  key: (ref: string) => ["keys", "one", ref] as const,
  audit: (f: object) => ["audit", "list", f] as const,
  auditAll: ["audit"] as const,
  users: ["users"] as const,
  tokens: (all: boolean) => ["tokens", all] as const,
  tokensAll: ["tokens"] as const,
};

export function useKeys(f: KeyFilter, enabled = true) {
  return useQuery({
    queryKey: qk.keys(f),
    queryFn: () => call(api.GET("/api/v1/keys", { params: { query: {
      q: f.q || undefined, state: f.state || undefined, tag: f.tag || undefined, limit: f.limit, offset: f.offset,
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
