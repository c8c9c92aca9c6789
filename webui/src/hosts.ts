// Hosts and enrollment: the rules the pages share (status, token state, the installer
// one-liner), kept apart from rendering so they are tested on their own.
import type { EnrollmentToken, Host } from "./api/client";

export type HostStatus = "online" | "offline" | "revoked";
export const HOST_STATUSES: HostStatus[] = ["online", "offline", "revoked"];

/** Revoked wins; otherwise the server's `online` (a heartbeat within three intervals). */
export function hostStatus(h: Pick<Host, "state" | "online">): HostStatus {
  if (h.state === "revoked") return "revoked";
  return h.online ? "online" : "offline";
}

export type TokenState = "active" | "used up" | "expired" | "revoked";

/** What an enrollment token can still do, in the order the server checks (revoked first). */
export function tokenState(t: Pick<EnrollmentToken, "revoked_at" | "uses" | "max_uses" | "expires_at">,
                           now = Date.now()): TokenState {
  if (t.revoked_at) return "revoked";
  if (t.uses >= t.max_uses) return "used up";
  if (new Date(t.expires_at).getTime() <= now) return "expired";
  return "active";
}

/** Keys reach the hosts whose group is the key's `host-group` tag (docs/api.md). */
export const HOST_GROUP_TAG = "host-group";
export const hostGroupTag = (group: string) => `${HOST_GROUP_TAG}=${group}`;

/** As the server validates a host group (keyserver/core/hosts.py GROUP_RE). */
export const HOST_GROUP_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/** Audit records of a host's own calls name it so (the agent's events, key deliveries). */
export const hostActor = (hostname: string) => `host:${hostname}`;

/**
 * The server's one-liner with the enrollment token in place of its `TOKEN` placeholder
 * (the last one: the command ends with `--token TOKEN`). Tokens are `sre_` + URL-safe
 * base64, so they need no shell quoting.
 */
export function installCommand(template: string, secret: string): string {
  const at = template.lastIndexOf("TOKEN");
  if (at < 0) return `${template} --token ${secret}`;
  return template.slice(0, at) + secret + template.slice(at + "TOKEN".length);
}
