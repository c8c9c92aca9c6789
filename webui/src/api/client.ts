// The typed REST client: openapi-fetch over the generated `paths` (schema.ts).
// Adds what the keyserver's browser sessions need: same-origin cookies, the CSRF
// header on unsafe methods, and problem+json errors turned into `ApiError`.
import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema";

export type Schemas = components["schemas"];
export type Me = Schemas["Me"];
export type Key = Schemas["KeyPublic"];
export type KeyVersion = Schemas["KeyVersionPublic"];
export type KeyState = Key["state"];
export type AuditEvent = Schemas["AuditEventPublic"];
export type VerifyResult = Schemas["VerifyResultPublic"];
export type User = Schemas["UserPublic"];
export type Role = User["role"];
export type Token = Schemas["TokenPublic"];
export type RevokeReason = Schemas["RevokeRequest"]["reason"];
export type Host = Schemas["HostPublic"];
export type HostGuardPoint = Schemas["HostGuardPoint"];
export type EnrollmentToken = Schemas["EnrollmentTokenPublic"];
export type EnrollmentInfo = Schemas["EnrollmentInfo"];

export const KEY_STATES: KeyState[] = [
  "pre-active", "active", "deactivated", "compromised", "destroyed", "destroyed-compromised",
];
export const ROLES: Role[] = ["admin", "key-officer", "operator", "auditor", "storage-admin", "kmip-client"];

/** An RFC 9457 problem from the keyserver (or a network failure, code "network"). */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly requestId: string | null;
  readonly retryAfter: string | null;

  constructor(init: { status: number; code: string; detail: string; requestId?: string | null;
                      retryAfter?: string | null }) {
    super(init.detail);
    this.name = "ApiError";
    this.status = init.status;
    this.code = init.code;
    this.detail = init.detail;
    this.requestId = init.requestId ?? null;
    this.retryAfter = init.retryAfter ?? null;
  }
}

const UNSAFE = new Set(["POST", "PUT", "PATCH", "DELETE"]);

export function readCookie(name: string): string | null {
  if (typeof document === "undefined") return null;
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return decodeURIComponent(v.join("="));
  }
  return null;
}

const csrf: Middleware = {
  onRequest({ request }) {
    if (UNSAFE.has(request.method)) {
      const token = readCookie("strongroom_csrf");
      if (token) request.headers.set("X-CSRF-Token", token);
    }
    return request;
  },
};

type Listener = (error: ApiError) => void;
const authListeners = new Set<Listener>();
/** Called on every 401 and on 403 password_change_required (session handling). */
export function onAuthProblem(listener: Listener): () => void {
  authListeners.add(listener);
  return () => authListeners.delete(listener);
}

export const api = createClient<paths>({ baseUrl: "", credentials: "same-origin" });
api.use(csrf);

export async function problemOf(response: Response, body: unknown): Promise<ApiError> {
  const p = (body ?? {}) as { code?: string; detail?: unknown; request_id?: string };
  const detail = typeof p.detail === "string" ? p.detail
    : response.statusText || `request failed with status ${response.status}`;
  return new ApiError({
    status: response.status, code: p.code ?? `http_${response.status}`, detail,
    requestId: p.request_id ?? response.headers.get("x-request-id"),
    retryAfter: response.headers.get("retry-after"),
  });
}

/** Await an openapi-fetch call; return its data or throw an ApiError. */
export async function call<T>(
  promise: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<T> {
  let result: { data?: T; error?: unknown; response: Response };
  try {
    result = await promise;
  } catch {
    throw new ApiError({ status: 0, code: "network",
      detail: "The key server could not be reached. Check your connection and that the server is running." });
  }
  const { data, error, response } = result;
  if (!response.ok) {
    const err = await problemOf(response, error);
    if (err.status === 401 || err.code === "password_change_required") {
      authListeners.forEach((l) => l(err));
    }
    throw err;
  }
  return data as T;
}

/** The internal CA's certificate (public): hosts pin it. */
export const CA_PEM_URL = "/ca.pem";

/** URL of the audit export (a plain download link: the session cookie goes with it). */
export function auditExportUrl(format: "csv" | "jsonl", filters: Record<string, string | undefined>): string {
  const q = new URLSearchParams({ format });
  for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
  return `/api/v1/audit/export?${q.toString()}`;
}
