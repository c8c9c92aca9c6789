// The dashboard's pictures and alerts: audit activity over time (from the server's hourly
// counts, GET /audit/activity) and what needs attention now, each linking to the view
// that shows it.
import { BarChart } from "@mantine/charts";
import { Alert, Anchor, Box, Group, SegmentedControl, SimpleGrid, Stack, Table, Text } from "@mantine/core";
import { IconAlertTriangle, IconCircleCheck, IconInfoCircle } from "@tabler/icons-react";
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";
import { api, call, type Host, type Key, type Schemas } from "../api/client";
import { HELD } from "../approvals";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtRelative } from "../components/bits";
import { hostStatus } from "../hosts";
import { qk, useAuditStatus, useHosts } from "../queries";
import { Panel } from "../components/Panel";

type Activity = Schemas["AuditActivity"];
type Health = Schemas["SystemHealth"];

export const RANGES = {
  "24h": { label: "24 hours", hours: 24, bucket: "hour" },
  "7d": { label: "7 days", hours: 24 * 7, bucket: "hour" },
  "30d": { label: "30 days", hours: 24 * 30, bucket: "day" },
} as const;
export type Range = keyof typeof RANGES;
const ACTIVITY_REFRESH_MS = 60_000;

/** The audit page's `since`/`until` filters take UTC minutes. */
const urlTime = (iso: string) => iso.slice(0, 16);

export function useActivity(range: Range, enabled = true) {
  const r = RANGES[range];
  // Rounded to the minute so the query key is stable between renders.
  const until = new Date(Math.ceil(Date.now() / 60_000) * 60_000 + 60_000);
  const since = new Date(until.getTime() - r.hours * 3_600_000);
  return useQuery({
    queryKey: ["audit", "activity", range, until.toISOString().slice(0, 15)],
    queryFn: () => call(api.GET("/api/v1/audit/activity", { params: { query: {
      since: since.toISOString(), until: until.toISOString(), bucket: r.bucket } } })),
    refetchInterval: ACTIVITY_REFRESH_MS,
    placeholderData: (prev) => prev,
    enabled,
  });
}

export function label(start: string, bucket: "hour" | "day"): string {
  const d = new Date(start);
  const p = (n: number) => String(n).padStart(2, "0");
  return bucket === "hour" ? `${p(d.getUTCDate())}/${p(d.getUTCMonth() + 1)} ${p(d.getUTCHours())}:00`
    : `${d.getUTCFullYear()}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())}`;
}

function Ranked({ title, rows, link }: { title: string; rows: { name: string; count: number }[]; link: (name: string) => string }) {
  return (
    <div>
      <Text size="sm" fw={600} mb={4}>{title}</Text>
      {rows.length === 0 ? <Text size="sm" c="dimmed">none</Text> : (
        <Table.ScrollContainer minWidth={0}>
          <Table fz="sm" verticalSpacing={2} withRowBorders={false}>
            <Table.Tbody>
              {rows.map((r) => (
                <Table.Tr key={r.name}>
                  <Table.Td style={{ overflowWrap: "anywhere" }}>
                    <Anchor component={Link} to={link(r.name)} size="sm">{r.name || "(no reason given)"}</Anchor>
                  </Table.Td>
                  <Table.Td ta="right" w={70}>{r.count.toLocaleString()}</Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </div>
  );
}

export function AuditActivityPanel() {
  const [range, setRange] = useState<Range>("24h");
  const q = useActivity(range);
  const a = q.data;
  const since = a?.buckets[0]?.start;
  const refusedLink = (extra: Record<string, string>) =>
    `/audit?${new URLSearchParams({ outcome: "denied", ...(since ? { since: urlTime(since) } : {}), ...extra })}`;
  return (
    <Panel title="Audit activity" right={
      <div role="group" aria-label="Time range">
        <SegmentedControl size="xs" value={range} onChange={(v) => setRange(v as Range)}
                          data={Object.entries(RANGES).map(([value, r]) => ({ value, label: r.label }))} />
      </div>}>
      {q.error ? <ErrorAlert error={q.error} /> : !a ? <Loading /> : (
        <Stack gap="sm" data-testid="audit-activity">
          <Group gap="lg">
            <Text size="sm"><b>{a.totals.allowed.toLocaleString()}</b> allowed</Text>
            <Anchor component={Link} to={refusedLink({})} size="sm" c="var(--sr-text-danger)">
              <b>{a.totals.denied.toLocaleString()}</b> denied</Anchor>
            <Anchor component={Link} to={`/audit?${new URLSearchParams({ outcome: "error", ...(since ? { since: urlTime(since) } : {}) })}`}
                    size="sm" c="var(--sr-text-warning)"><b>{a.totals.error.toLocaleString()}</b> failed</Anchor>
          </Group>
          {/* Clipped: the hidden tooltip is laid out past the chart's edge (see KeysByState). */}
          <Box style={{ overflow: "hidden" }} role="img" aria-label={`Audit records per ${a.bucket} by outcome: `
            + `${a.totals.allowed} allowed, ${a.totals.denied} denied, ${a.totals.error} failed`}>
            <BarChart h={220} type="stacked" withLegend legendProps={{ verticalAlign: "top", height: 32 }}
                      data={a.buckets.map((b) => ({ ...b, when: label(b.start, a.bucket) }))} dataKey="when"
                      series={[{ name: "allowed", color: "teal.7", label: "Allowed" },
                               { name: "denied", color: "red.7", label: "Denied" },
                               { name: "error", color: "orange.6", label: "Failed" }]}
                      tickLine="none" gridAxis="y" xAxisProps={{ minTickGap: 24 }} yAxisProps={{ allowDecimals: false, width: 48 }} />
          </Box>
          <SimpleGrid cols={{ base: 1, sm: 3 }} spacing="md">
            <Ranked title="Most refused actors" rows={a.top_refused_actors} link={(n) => refusedLink({ actor: n })} />
            <Ranked title="Most refused actions" rows={a.top_refused_actions} link={(n) => refusedLink({ action: n })} />
            <Ranked title="Refusal reasons" rows={a.top_refusal_reasons} link={() => refusedLink({})} />
          </SimpleGrid>
        </Stack>
      )}
    </Panel>
  );
}

export interface AttentionItem {
  id: string;
  level: "critical" | "warning" | "info";
  title: string;
  detail: string;
  to: string;
}

// A burst: the last hour's refusals are many, and many more than usual.
export const BURST_MIN = 20;
export const BURST_FACTOR = 5;

/** What needs attention now, most serious first, from what the roles may read. */
export function attention(input: {
  health?: Health; hosts?: Host[]; keys?: Key[]; activity?: Activity;
  chain?: { head_seq: number; verified: { seq: number; at: string } | null };
  /** Requests of the two-person rule this user may decide (someone else's, pending). */
  waiting?: { action: string; requested_by: string }[];
}, now = Date.now()): AttentionItem[] {
  const out: AttentionItem[] = [];
  const { health, hosts, keys, activity, chain, waiting } = input;
  if (waiting?.length) {
    out.push({ id: "approvals-waiting", level: "warning",
               title: `${waiting.length} request${waiting.length === 1 ? " waits" : "s wait"} for your approval`,
               detail: waiting.slice(0, 3).map((w) => `${w.action} by ${w.requested_by}`).join(", ")
                 + (waiting.length > 3 ? ", …" : ""), to: "/approvals" });
  }
  if (health) {
    for (const c of health.checks.filter((x) => !x.ok)) {
      out.push({ id: `check-${c.name}`, level: c.name === "audit_sinks" ? "warning" : "critical",
                 title: c.name === "audit_sinks" ? "An audit sink is failing" : `The ${c.name === "hsm" ? "HSM" : "database"} does not answer`,
                 detail: c.detail, to: "/system" });
    }
  }
  if (activity && activity.bucket === "hour" && activity.buckets.length >= 2) {
    const denied = activity.buckets.map((b) => b.denied + b.error);
    const last = denied[denied.length - 1]; // the current hour, so far
    const earlier = denied.slice(0, -1).sort((x, y) => x - y);
    const usual = earlier[Math.floor(earlier.length / 2)] ?? 0;
    if (last >= BURST_MIN && last >= BURST_FACTOR * Math.max(usual, 1)) {
      const start = activity.buckets[activity.buckets.length - 1].start;
      const who = activity.top_refused_actors[0];
      out.push({ id: "denial-burst", level: "critical", title: `${last.toLocaleString()} refusals this hour`,
                 detail: `Usually about ${usual} an hour.${who ? ` Most from ${who.name || "unknown"}.` : ""}`,
                 to: `/audit?${new URLSearchParams({ outcome: "denied", since: urlTime(start) })}` });
    }
  }
  if (hosts) {
    const offline = hosts.filter((h) => hostStatus(h) === "offline");
    if (offline.length) {
      out.push({ id: "hosts-offline", level: "warning",
                 title: `${offline.length} host${offline.length === 1 ? " is" : "s are"} offline`,
                 detail: offline.slice(0, 3).map((h) => h.hostname).join(", ") + (offline.length > 3 ? ", …" : ""),
                 to: "/hosts?status=offline" });
    }
    const errors = hosts.filter((h) => hostStatus(h) !== "revoked" && h.guard_points.some((g) => g.state === "error"));
    if (errors.length) {
      out.push({ id: "guard-point-errors", level: "warning",
                 title: `Guard points in error on ${errors.length} host${errors.length === 1 ? "" : "s"}`,
                 detail: errors.slice(0, 3).map((h) => h.hostname).join(", "), to: `/hosts/${errors[0].id}` });
    }
  }
  if (keys) {
    const overdue = keys.filter((k) => k.state === "active" && k.next_rotation_at && new Date(k.next_rotation_at).getTime() < now);
    if (overdue.length) {
      out.push({ id: "rotations-overdue", level: "warning",
                 title: `${overdue.length} key rotation${overdue.length === 1 ? " is" : "s are"} overdue`,
                 detail: overdue.slice(0, 3).map((k) => `${k.name} (due ${fmtRelative(k.next_rotation_at, now)})`).join(", "),
                 to: overdue.length === 1 ? `/keys/${encodeURIComponent(overdue[0].name)}` : "/keys?state=active" });
    }
  }
  if (chain && chain.head_seq > 0 && !chain.verified) {
    out.push({ id: "chain-unverified", level: "info", title: "The audit chain has not been verified yet",
               detail: "Verify it from the Audit chain panel, and keep a sink's copy of the checkpoints off the server.",
               to: "/audit" });
  }
  const order = { critical: 0, warning: 1, info: 2 };
  return out.sort((a, b) => order[a.level] - order[b.level]);
}

const LEVEL = {
  critical: { color: "red", icon: IconAlertTriangle },
  warning: { color: "orange", icon: IconAlertTriangle },
  info: { color: "blue", icon: IconInfoCircle },
} as const;

export function AttentionPanel() {
  const { can, me } = useAuth();
  const health = useQuery({ queryKey: qk.health, queryFn: () => call(api.GET("/api/v1/system/health")),
                            refetchInterval: 30_000, enabled: can("system:read") });
  const hosts = useHosts(can("hosts:read"));
  // Overdue ones first (soonest rotation first, unscheduled last): a short page finds them.
  const keys = useQuery({
    queryKey: ["keys", "list", { limit: 50, offset: 0, state: "active", sort: "next_rotation_at" }],
    queryFn: () => call(api.GET("/api/v1/keys", { params: { query: { state: "active", limit: 50, sort: "next_rotation_at" } } })),
    enabled: can("keys:read"),
  });
  const activity = useActivity("24h", can("audit:read"));
  const chain = useAuditStatus(can("audit:read"));
  const approvals = useQuery({
    queryKey: ["approvals", "pending"],
    queryFn: () => call(api.GET("/api/v1/approvals", { params: { query: { state: "pending" } } })),
    refetchInterval: 30_000,
    enabled: Object.values(HELD).some((h) => can(h.perm)),
  });
  const waiting = (approvals.data ?? []).filter((a) => a.requested_by !== me?.username && HELD[a.action] && can(HELD[a.action].perm)
                                                     && !a.approvals.some((x) => x.by === me?.username));
  const items = attention({ health: health.data, hosts: hosts.data?.items, keys: keys.data?.items, activity: activity.data,
                            chain: chain.data, waiting });
  const loading = [health, hosts, keys, activity, chain].some((q) => q.isLoading);
  return (
    <Panel title="Needs attention">
      {loading && items.length === 0 ? <Loading /> : items.length === 0 ? (
        <Group gap="xs" data-testid="attention-none"><IconCircleCheck color="var(--mantine-color-teal-7)" size={20} />
          <Text size="sm">Nothing needs attention: every check passes, hosts are online, rotations are on time.</Text></Group>
      ) : (
        <Stack gap="xs" data-testid="attention">
          {items.map((i) => {
            const L = LEVEL[i.level];
            return (
              <Alert key={i.id} color={L.color} variant="light" icon={<L.icon size={18} />} data-alert={i.id} data-level={i.level}
                     title={<Anchor component={Link} to={i.to} size="sm" fw={700} c="inherit" underline="always">{i.title}</Anchor>}>
                <Text size="sm">{i.detail}</Text>
              </Alert>
            );
          })}
        </Stack>
      )}
      {!loading && items.length === 0 && [health, hosts, keys, activity].every((q) => !q.data && !q.isLoading) && (
        <EmptyState title="Nothing to watch for your role" />
      )}
    </Panel>
  );
}
