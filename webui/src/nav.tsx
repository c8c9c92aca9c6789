import { IconChecklist, IconCloudLock, IconCpu, IconDashboard, IconDatabase, IconDatabaseCog, IconPlugConnected, IconKey, IconListDetails, IconServer2, IconShieldLock, IconTicket, IconUsers } from "@tabler/icons-react";
import type { ComponentType } from "react";
import type { Permission } from "./auth";

export interface NavItem {
  to: string;
  label: string;
  icon: ComponentType<{ size?: number; stroke?: number }>;
  /** Shown only to roles with this permission. */
  perm?: Permission;
  /** …or with any of these. */
  anyOf?: Permission[];
}

// The console's sections. Extension point: guard-point policies (issue 5) add their entry
// here (plus a route in router.tsx) when their API exists — the console shows nothing for
// features the server does not have yet.
export const NAV: NavItem[] = [
  { to: "/", label: "Dashboard", icon: IconDashboard },
  { to: "/keys", label: "Keys", icon: IconKey, perm: "keys:read" },
  { to: "/hosts", label: "Hosts", icon: IconServer2, perm: "hosts:read" },
  { to: "/guard-points", label: "Guard points", icon: IconShieldLock, perm: "hosts:read" },
  { to: "/volumes", label: "Volumes", icon: IconDatabase, perm: "hosts:read" },
  { to: "/audit", label: "Audit log", icon: IconListDetails, perm: "audit:read" },
  { to: "/users", label: "Users", icon: IconUsers, perm: "users:read" },
  { to: "/tokens", label: "API tokens", icon: IconTicket, perm: "tokens:own" },
  { to: "/kmip-clients", label: "KMIP clients", icon: IconPlugConnected, perm: "kmip:clients" },
  { to: "/databases", label: "Databases", icon: IconDatabaseCog, perm: "databases:read" },
  { to: "/aws-key-stores", label: "AWS key stores", icon: IconCloudLock, perm: "xks:read" },
  { to: "/approvals", label: "Approvals", icon: IconChecklist,
    anyOf: ["keys:destroy", "system:kek", "users:manage", "keys:export", "audit:read"] },
  { to: "/system", label: "System", icon: IconCpu, perm: "system:read" },
];

/** Whether a role may see a section (its permission, or any of its alternatives). */
export const mayOpen = (n: NavItem, can: (p: Permission) => boolean) =>
  (!n.perm || can(n.perm)) && (!n.anyOf || n.anyOf.some(can));
