import { ActionIcon, Badge, Center, CopyButton, Group, Loader, Stack, Text, ThemeIcon, Tooltip } from "@mantine/core";
import { IconCheck, IconCopy, IconInbox } from "@tabler/icons-react";
import type { ReactNode } from "react";
import type { KeyState } from "../api/client";
import type { HostStatus, TokenState } from "../hosts";

export const STATE_COLOR: Record<KeyState, string> = {
  "pre-active": "gray",
  active: "teal",
  deactivated: "yellow",
  compromised: "red",
  destroyed: "dark",
  "destroyed-compromised": "grape",
};

export function StateBadge({ state }: { state: KeyState }) {
  return <Badge color={STATE_COLOR[state]} variant="light" radius="sm" data-state={state}>{state}</Badge>;
}

export function OutcomeBadge({ outcome }: { outcome: string }) {
  const color = outcome === "allowed" ? "teal" : outcome === "denied" ? "red" : "orange";
  return <Badge color={color} variant="light" radius="sm">{outcome}</Badge>;
}

const HOST_STATUS: Record<HostStatus, { color: string; label: string }> = {
  online: { color: "teal", label: "Online" },
  offline: { color: "orange", label: "Offline" },
  revoked: { color: "red", label: "Revoked" },
};

export function HostStatusBadge({ status }: { status: HostStatus }) {
  const s = HOST_STATUS[status];
  return <Badge color={s.color} variant="light" radius="sm" data-status={status}>{s.label}</Badge>;
}

const TOKEN_STATE_COLOR: Record<TokenState, string> = { active: "teal", "used up": "gray", expired: "gray", revoked: "red" };

export function TokenStateBadge({ state }: { state: TokenState }) {
  return <Badge color={TOKEN_STATE_COLOR[state]} variant="light" radius="sm" data-state={state}
                style={{ overflow: "visible" }}>{state}</Badge>;
}

/** A guard point as the agent reports it: mounted, off (encryption off), protecting or
 *  unprotecting (files being transformed in place), unmounted or error. */
export function GuardPointStateBadge({ state }: { state: string }) {
  const color = state === "mounted" ? "teal" : state === "error" || state === "off" ? "red"
    : state === "protecting" || state === "unprotecting" ? "blue" : "gray";
  const label = state === "off" ? "encryption off" : state;
  return <Badge color={color} variant="light" radius="sm" data-state={state} style={{ overflow: "visible" }}>{label}</Badge>;
}

export function Loading({ label = "Loading…" }: { label?: string }) {
  return (
    <Center py="xl" role="status" aria-live="polite">
      <Group gap="xs"><Loader size="sm" /><Text size="sm" c="dimmed">{label}</Text></Group>
    </Center>
  );
}

export function EmptyState({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <Center py="xl">
      <Stack align="center" gap={4}>
        <ThemeIcon variant="light" color="gray" size="lg" radius="xl"><IconInbox size={18} /></ThemeIcon>
        <Text fw={600} size="sm">{title}</Text>
        {children && <Text size="sm" c="dimmed" ta="center" maw={420}>{children}</Text>}
      </Stack>
    </Center>
  );
}

export function CopyValue({ value, label = "Copy" }: { value: string; label?: string }) {
  return (
    <CopyButton value={value} timeout={2000}>
      {({ copied, copy }) => (
        <Tooltip label={copied ? "Copied" : label} withArrow>
          <ActionIcon variant="subtle" color={copied ? "teal" : "gray"} onClick={copy} aria-label={label}>
            {copied ? <IconCheck size={16} /> : <IconCopy size={16} />}
          </ActionIcon>
        </Tooltip>
      )}
    </CopyButton>
  );
}

const pad = (n: number) => String(n).padStart(2, "0");
/** Times are shown in UTC, as the audit log records them. */
export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())} UTC`;
}

export function fmtRelative(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return "—";
  const ms = new Date(iso).getTime() - now;
  const abs = Math.abs(ms);
  const unit = abs >= 86_400_000 ? ["day", 86_400_000] as const
    : abs >= 3_600_000 ? ["hour", 3_600_000] as const : ["minute", 60_000] as const;
  const n = Math.round(abs / unit[1]);
  const s = `${n} ${unit[0]}${n === 1 ? "" : "s"}`;
  return ms >= 0 ? `in ${s}` : `${s} ago`;
}
