// The two-person rule's held actions as the server names them (keyserver/core/approvals.py
// ACTIONS): what the console calls each, and the permission approving it needs.
import type { Permission } from "./auth";

export const HELD: Record<string, { label: string; perm: Permission }> = {
  "key.destroy": { label: "Destroy a key", perm: "keys:destroy" },
  "kek.rotate": { label: "Rotate the KEK", perm: "system:kek" },
  "kek.retire": { label: "Retire a KEK", perm: "system:kek" },
  "user.role": { label: "Change a user's role", perm: "users:manage" },
  "key.retire": { label: "Retire a key version", perm: "keys:destroy" },
  "key.retire_exclude": { label: "Exclude a holder from a retirement", perm: "keys:destroy" },
  "key.export": { label: "Export a key in plaintext", perm: "keys:export" },
  "database.grant": { label: "Grant a key to a database", perm: "keys:export" },
  "token.create": { label: "An API token for another account", perm: "tokens:all" },
  "user.create": { label: "Create an account that may approve", perm: "users:manage" },
  "user.password": { label: "Reset an approver's password", perm: "users:manage" },
  "user.totp": { label: "Remove an approver's second factor", perm: "users:manage" },
};

/** The server's words when a request was held for approval (202), else null. */
export function heldDetail(r: unknown): string | null {
  const p = r as { status?: string; detail?: string } | null;
  return p?.status === "pending" ? (p.detail ?? "It waits for another person's approval.") : null;
}
