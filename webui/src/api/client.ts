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
  /** What was wrong with each refused body field, in words, by the field's name ("name", "full_name"). */
  readonly fields: Readonly<Record<string, string>>;

  constructor(init: { status: number; code: string; detail: string; requestId?: string | null;
                      retryAfter?: string | null; fields?: Record<string, string> }) {
    super(init.detail);
    this.name = "ApiError";
    this.status = init.status;
    this.code = init.code;
    this.detail = init.detail;
    this.requestId = init.requestId ?? null;
    this.retryAfter = init.retryAfter ?? null;
    this.fields = init.fields ?? {};
  }
}

/** The server's words about one field of a refused request (a 422), to show under that field. */
export function fieldError(error: unknown, field: string): string | null {
  return error instanceof ApiError ? error.fields[field] ?? null : null;
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

type ProblemBody = { code?: unknown; title?: unknown; detail?: unknown; request_id?: unknown; errors?: unknown };
type FieldError = { loc?: unknown; msg?: unknown };

/** pydantic's words without its machinery: "Value error, name is taken" → "name is taken",
 *  "String should have at most 128 characters" → "At most 128 characters". */
function plainWords(msg: string): string {
  return msg.replace(/^(Value|Assertion) error,\s*/i, "")
    .replace(/^(?:String|List|Value) should have (at (?:most|least) [\d,]+ (?:characters?|items?))/i,
             (_, rest: string) => rest[0].toUpperCase() + rest.slice(1))
    .trim();
}

/** "body.tags.env" → "Tags › env": where the value was, as a person names it. */
function fieldName(loc: unknown): string | null {
  if (!Array.isArray(loc)) return null;
  const parts = loc.filter((p) => typeof p === "string" && !["body", "query", "path", "header", "cookie"].includes(p))
    .map((p) => (p as string).replace(/_/g, " "));
  if (!parts.length) return null;
  const name = parts.join(" › ");
  return name[0].toUpperCase() + name.slice(1);
}

/**
 * The one place where a refusal becomes words for a person: the API's problem+json
 * (title, detail, errors) read as "what was wrong", never as raw validation output or a
 * JSON dump. What to do next is ErrorAlert's hint, by the problem's code.
 */
export function problemMessage(body: unknown, fallback: string): string {
  const p = (body && typeof body === "object" ? body : {}) as ProblemBody;
  const fields = Array.isArray(p.errors)
    ? (p.errors as FieldError[]).filter((e) => e && typeof e.msg === "string")
    : [];
  if (fields.length) {
    const said = fields.slice(0, 3).map((e) => {
      const where = fieldName(e.loc);
      const what = plainWords(e.msg as string);
      return where ? `${where}: ${what}` : what;
    });
    const more = fields.length > 3 ? ` (and ${fields.length - 3} more)` : "";
    return said.join("; ") + more;
  }
  if (typeof p.detail === "string" && p.detail.trim() && !/^\s*[[{]/.test(p.detail)) {
    return plainWords(p.detail.replace(/(^|:\s)(Value|Assertion) error,\s*/g, "$1"));
  }
  if (typeof p.title === "string" && p.title.trim()) return p.title;
  return fallback;
}

/** Each refused body field's words, by its name (the first error of a field wins). */
function bodyFieldErrors(body: unknown): Record<string, string> {
  const p = (body && typeof body === "object" ? body : {}) as ProblemBody;
  const fields: Record<string, string> = {};
  for (const e of Array.isArray(p.errors) ? (p.errors as FieldError[]) : []) {
    if (!e || typeof e.msg !== "string" || !Array.isArray(e.loc) || e.loc[0] !== "body" || typeof e.loc[1] !== "string") continue;
    fields[e.loc[1]] ??= plainWords(e.msg);
  }
  return fields;
}

export async function problemOf(response: Response, body: unknown): Promise<ApiError> {
  const p = (body && typeof body === "object" ? body : {}) as { code?: unknown; request_id?: unknown };
  const detail = problemMessage(body, response.statusText || `The server answered ${response.status}.`);
  return new ApiError({
    status: response.status, code: typeof p.code === "string" ? p.code : `http_${response.status}`, detail,
    requestId: typeof p.request_id === "string" ? p.request_id : response.headers.get("x-request-id"),
    retryAfter: response.headers.get("retry-after"), fields: bodyFieldErrors(body),
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
