// When each of a host's guard points was serving, stopped, or stopped on a crash. Drawn
// from the agent's own audit records (agent.guardpoint.mounted / .unmounted, with the time
// on the host), so the picture is what the tamper-evident log says, not a separate store.
import { Box, Group, Stack, Table, Text, Tooltip } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { api, call, type AuditEvent, type Host } from "../api/client";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtTime } from "../components/bits";
import { Panel } from "../components/Panel";
import { hostActor } from "../hosts";
import { TIMELINE_RANGES, TimelineRangeControl, type TimelineRange } from "./Usage";

export type GpState = "mounted" | "stopped" | "crashed" | "unknown";
export type Span = { from: number; to: number; state: GpState };
export type Change = { at: number; state: GpState; status?: number };
export type Row = { path: string; spans: Span[]; changes: Change[] };

const PAGE = 1000; // records asked for; more in the window is said, not drawn

export const STATE_LOOK: Record<GpState, { colour: string; label: string }> = {
  mounted: { colour: "var(--mantine-color-teal-6)", label: "serving (mounted)" },
  stopped: { colour: "var(--mantine-color-gray-5)", label: "stopped" },
  crashed: { colour: "var(--mantine-color-red-7)", label: "stopped on a crash" },
  unknown: { colour: "var(--mantine-color-gray-2)", label: "no record" },
};

function changeOf(e: AuditEvent): Change | null {
  const at = Date.parse(String(e.details?.reported_at ?? e.time));
  if (Number.isNaN(at)) return null;
  if (e.action === "agent.guardpoint.mounted") return { at, state: "mounted" };
  if (e.action === "agent.guardpoint.unmounted") {
    const status = typeof e.details?.status === "number" ? e.details.status : undefined;
    return { at, state: status ? "crashed" : "stopped", status };
  }
  return null;
}

/** Each guard point's states over [since, until): from its mount and unmount records and,
 * with none in the window, from what the host reports now. */
export function guardPointRows(events: AuditEvent[], reported: Host["guard_points"], since: number,
                               until: number): Row[] {
  const byPath = new Map<string, Change[]>();
  for (const e of events) {
    const c = changeOf(e);
    if (!c || !e.object_id || c.at >= until) continue;
    byPath.set(e.object_id, [...(byPath.get(e.object_id) ?? []), c]);
  }
  const now = new Map(reported.map((g) => [g.path, g.state === "mounted" ? "mounted" as const : "stopped" as const]));
  const paths = [...new Set([...now.keys(), ...byPath.keys()])].sort();
  return paths.map((path) => {
    const changes = (byPath.get(path) ?? []).sort((a, b) => a.at - b.at);
    const spans: Span[] = [];
    // Before the window's first record: an unmount means it was serving, a mount that it was not.
    let state: GpState = changes.length === 0 ? (now.get(path) ?? "unknown")
      : changes[0].state === "mounted" ? "unknown" : "mounted";
    let from = since;
    for (const c of changes) {
      const at = Math.max(c.at, since);
      if (at > from) spans.push({ from, to: at, state });
      state = c.state;
      from = at;
    }
    if (until > from) spans.push({ from, to: until, state });
    return { path, spans, changes: changes.filter((c) => c.at >= since) };
  });
}

export function GuardPointTimeline({ h }: { h: Host }) {
  const [range, setRange] = useState<TimelineRange>("24h");
  const until = Math.ceil(Date.now() / 60_000) * 60_000 + 60_000;
  const since = until - TIMELINE_RANGES[range] * 3_600_000;
  const q = useQuery({
    queryKey: ["audit", "events", "guard-point-states", h.hostname, range, until],
    queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: {
      actor: hostActor(h.hostname), action: "agent.guardpoint.", since: new Date(since).toISOString(), limit: PAGE } } })),
    refetchInterval: 60_000,
    placeholderData: (prev) => prev,
  });
  const rows = q.data ? guardPointRows(q.data.items, h.guard_points, since, until) : [];
  const span = until - since;
  return (
    <Panel title="Guard points over time"
           right={<TimelineRangeControl value={range} onChange={setRange} label="Guard point timeline range" />}>
      {q.error ? <ErrorAlert error={q.error} /> : !q.data ? <Loading /> : rows.length === 0 ? (
        <EmptyState title="No guard points on this host">
          The agent records each mount and unmount in the audit log; they are drawn here.
        </EmptyState>
      ) : (
        <Stack gap="sm" data-testid="guard-point-timeline">
          {q.data.next_before_seq != null && (
            <Text size="xs" c="dimmed">Only the newest {PAGE} records of this window are drawn; the audit log has them all.</Text>
          )}
          {rows.map((r) => (
            <Stack key={r.path} gap={4} data-testid="guard-point-row" data-path={r.path}
                   data-states={r.spans.map((s) => s.state).join(" ")}>
              <Group justify="space-between" gap="xs">
                <Text size="sm" ff="monospace">{r.path}</Text>
                <Text size="xs" c="dimmed">{r.changes.length ? `${r.changes.length} change${r.changes.length > 1 ? "s" : ""}` : "no change"}</Text>
              </Group>
              <Box role="img" pos="relative" h={18} style={{ borderRadius: 3, overflow: "hidden", background: STATE_LOOK.unknown.colour }}
                   aria-label={`${r.path}: ${r.spans.map((s) => `${STATE_LOOK[s.state].label} from ${fmtTime(new Date(s.from).toISOString())} to ${fmtTime(new Date(s.to).toISOString())}`).join("; ")}`}>
                {r.spans.map((s) => (
                  <Tooltip key={s.from} label={`${STATE_LOOK[s.state].label}: ${fmtTime(new Date(s.from).toISOString())} – ${fmtTime(new Date(s.to).toISOString())}`}>
                    <Box pos="absolute" top={0} h="100%" style={{ left: `${((s.from - since) / span) * 100}%`,
                      // A minute-long outage in a week is still drawn: a few pixels at least.
                      width: `${((s.to - s.from) / span) * 100}%`, minWidth: s.state === "mounted" ? 0 : 4,
                      background: STATE_LOOK[s.state].colour, zIndex: s.state === "mounted" ? 0 : 1 }} />
                  </Tooltip>
                ))}
              </Box>
            </Stack>
          ))}
          <Group justify="space-between">
            <Text size="xs" c="dimmed">{fmtTime(new Date(since).toISOString())}</Text>
            <Group gap="md">
              {(Object.keys(STATE_LOOK) as GpState[]).map((s) => (
                <Group key={s} gap={4}><Box w={10} h={10} style={{ borderRadius: 2, background: STATE_LOOK[s].colour }} />
                  <Text size="xs">{STATE_LOOK[s].label}</Text></Group>
              ))}
            </Group>
            <Text size="xs" c="dimmed">now</Text>
          </Group>
          <ChangeList rows={rows} />
        </Stack>
      )}
    </Panel>
  );
}

function ChangeList({ rows }: { rows: Row[] }) {
  const all = rows.flatMap((r) => r.changes.map((c) => ({ ...c, path: r.path }))).sort((a, b) => b.at - a.at).slice(0, 10);
  if (all.length === 0) return null;
  return (
    <Table.ScrollContainer minWidth={560}>
      <Table fz="sm" verticalSpacing={4} data-testid="guard-point-changes">
        <Table.Thead><Table.Tr><Table.Th>On the host at</Table.Th><Table.Th>Guard point</Table.Th><Table.Th>Became</Table.Th></Table.Tr></Table.Thead>
        <Table.Tbody>
          {all.map((c) => (
            <Table.Tr key={`${c.path}-${c.at}-${c.state}`}>
              <Table.Td>{fmtTime(new Date(c.at).toISOString())}</Table.Td>
              <Table.Td ff="monospace">{c.path}</Table.Td>
              <Table.Td c={c.state === "crashed" ? "var(--sr-text-danger)" : undefined}>
                {STATE_LOOK[c.state].label}{c.state === "crashed" ? ` (status ${c.status})` : ""}
              </Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}
