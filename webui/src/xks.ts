// AWS KMS external key stores (XKS, docs/integrations.md): the calls, query keys and the
// server's input rules the pages share, kept apart from rendering so they are tested on their own.
import { useQuery } from "@tanstack/react-query";
import { api, call, type Schemas } from "./api/client";

export type XksStore = Schemas["XksStorePublic"];
export type XksKey = Schemas["XksKeyPublic"];
export type XksIssued = Schemas["XksStoreIssued"];

export const xksq = {
  all: ["xks"] as const,
  list: ["xks", "list"] as const,
  one: (name: string) => ["xks", "one", name] as const,
};

/** The console's page of a key store. */
export const xksPath = (name: string) => `/aws-key-stores/${encodeURIComponent(name)}`;
/** What AWS KMS appends to the path prefix (the XKS Proxy API v1). */
export const PROXY_API_SUFFIX = "/kms/xks/v1";
export const proxyUriPath = (s: Pick<XksStore, "uri_path_prefix">) => `${s.uri_path_prefix}${PROXY_API_SUFFIX}`;

const byName = (name: string) => ({ params: { path: { name } } });

export const xksApi = {
  list: () => call(api.GET("/api/v1/xks/stores")),
  get: (name: string) => call(api.GET("/api/v1/xks/stores/{name}", byName(name))),
  create: (body: { name: string; region: string; description: string; client_cert_subject?: string }) =>
    call(api.POST("/api/v1/xks/stores", { body })),
  /** `client_cert_subject: null` turns mutual TLS off. */
  setSubject: (name: string, subject: string | null) =>
    call(api.PATCH("/api/v1/xks/stores/{name}", { ...byName(name), body: { client_cert_subject: subject } })),
  rotate: (name: string) => call(api.POST("/api/v1/xks/stores/{name}/credential", byName(name))),
  retirePrevious: (name: string) => call(api.DELETE("/api/v1/xks/stores/{name}/credential/previous", byName(name))),
  revoke: (name: string) => call(api.POST("/api/v1/xks/stores/{name}/revoke", byName(name))),
  grant: (name: string, body: { key: string; external_id?: string }) =>
    call(api.POST("/api/v1/xks/stores/{name}/keys", { ...byName(name), body })),
  remove: (name: string, externalId: string) =>
    call(api.DELETE("/api/v1/xks/stores/{name}/keys/{external_id}",
                    { params: { path: { name, external_id: externalId } } })),
};

export function useXksStores() {
  return useQuery({ queryKey: xksq.list, queryFn: xksApi.list });
}

export function useXksStore(name: string) {
  return useQuery({ queryKey: xksq.one(name), queryFn: () => xksApi.get(name) });
}

export type XksState = "active" | "revoked";
export const xksState = (s: Pick<XksStore, "revoked_at">): XksState => (s.revoked_at ? "revoked" : "active");

// As keyserver/core/xks.py checks them; the same words, so the console and the server agree.
const NAME_RE = /^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$/;
const REGION_RE = /^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$/;
const EXTERNAL_ID_RE = /^[A-Za-z0-9._-]{1,128}$/;
const SUBJECT_RE = /^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

/** Why a typed key store name would be refused, or null. */
export function storeNameError(name: string): string | null {
  if (!name) return null;
  if ([...name].length > 64) return `At most 64 characters; this one has ${[...name].length}`;
  return NAME_RE.test(name) ? null
    : "1 to 64 lower-case letters, digits, '.', '_' or '-', beginning and ending with a letter or digit";
}

export function regionError(region: string): string | null {
  if (!region) return null;
  return REGION_RE.test(region) ? null : "An AWS region name such as eu-west-1, as AWS KMS signs with it";
}

/** AWS KMS's client certificate subject for a key store in `region`. */
export const awsSubjectFor = (region: string) => `cks.kms.${region}.amazonaws.com`;

/** Why a required client certificate subject would be refused, or null (empty: none). */
export function subjectError(subject: string): string | null {
  if (!subject) return null;
  return SUBJECT_RE.test(subject.toLowerCase()) ? null
    : "A DNS name without wildcards, such as cks.kms.eu-west-1.amazonaws.com (at most 253 characters)";
}

/** Why an external key id would be refused, or null. `taken`: the ids the store has. */
export function externalIdError(id: string, taken: string[] = []): string | null {
  if (!EXTERNAL_ID_RE.test(id)) return "1 to 128 letters, digits, '.', '_' or '-'";
  if (taken.includes(id)) return `This key store already has external key id ${id}: remove it first, or choose another`;
  return null;
}
