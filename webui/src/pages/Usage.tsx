// Pictures of use: a key's operations over time and who made them; a host's heartbeats
// (its online timeline) and the keys it used. Both read hourly counts on the server, so
// they cost the same at a thousand audit records or at millions.
import { BarChart } from "@mantine/charts";
import { Anchor, Box, Group, SegmentedControl, SimpleGrid, Stack, Table, Text, Tooltip } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";
import { api, call } from "../api/client";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading } from "../components/bits";
import { Panel } from "../components/Panel";
import { useKey } from "../queries";
import { RANGES, label, type Range } from "./DashboardActivity";

/** Colours for the actions drawn, in the order of their counts (most first). */
const ACTION_COLOURS = ["indigo.6", "teal.7", "grape.6", "orange.7", "cyan.7", "pink.6", "lime.8", "gray.6"];
const ACTIONS_DRAWN = ACTION_COLOURS.length - 1; // the rest as "other"
const OTHER = "other";

function window(range: Range) {
  // Rounded to the minute so the query key is stable between renders.
  const until = new Date(Math.ceil(Date.now() / 60_000) * 60_000 + 60_000);
  return { since: new Date(until.getTime() - RANGES[range].hours * 3_600_000), until };
}

type Target = { key_id: string; actor?: never } | { actor: string; key_id?: never };

export function useUsage(target: Target, range: Range, enabled = true) {
  const { since, until } = window(range);
  return useQuery({
    queryKey: ["audit", "usage", target, range, until.toISOString().slice(0, 15)],
    queryFn: () => call(api.GET("/api/v1/audit/usage", { params: { query: {
      ...target, since: since.toISOString(), until: until.toISOString(), bucket: RANGES[range].bucket } } })),
    refetchInterval: 60_000,
    placeholderData: (prev) => prev,
    enabled,
  });
}

function RangePicker({ range, onChange }: { range: Range; onChange: (r: Range) => void }) {
  return (
    <div role="group" aria-label="Time range">
      <SegmentedControl size="xs" value={range} onChange={(v) => onChange(v as Range)}
                        data={Object.entries(RANGES).map(([value, r]) => ({ value, label: r.label }))} />
    </div>
  );
}

function UsageChart({ target, title, topTitle, topLink, topName }: {
  target: Target; title: string; topTitle: string;
  topLink: (name: string) => string; topName?: (name: string) => React.ReactNode;
}) {
  const [range, setRange] = useState<Range>("24h");
  const q = useUsage(target, range);
  const u = q.data;
  const drawn = (u?.actions ?? []).slice(0, ACTIONS_DRAWN).map((a) => a.name);
  const hasOther = (u?.actions.length ?? 0) > ACTIONS_DRAWN;
  // Series are keyed s0, s1, …: the chart library reads "key.rotate" as a path.
  const series = [...drawn, ...(hasOther ? [OTHER] : [])].map((name, i) => ({ name: `s${i}`, label: name,
                                                                              color: ACTION_COLOURS[i] }));
  const data = (u?.buckets ?? []).map((b) => {
    const row: Record<string, string | number> = { when: label(b.start, u!.bucket) };
    drawn.forEach((name, i) => { row[`s${i}`] = b.counts[name] ?? 0; });
    if (hasOther) {
      row[`s${drawn.length}`] = Object.entries(b.counts).filter(([k]) => !drawn.includes(k)).reduce((n, [, v]) => n + v, 0);
    }
    return row;
  });
  return (
    <Panel title={title} right={<RangePicker range={range} onChange={setRange} />}>
      {q.error ? <ErrorAlert error={q.error} /> : !u ? <Loading /> : u.total === 0 ? (
        <EmptyState title={`No use in the last ${RANGES[range].label}`}>
          Allowed operations appear here a moment after they are made (they are counted as the audit chain grows).
        </EmptyState>
      ) : (
        <Stack gap="sm" data-testid="usage-chart" data-total={u.total}>
          <Group gap="lg">
            {u.actions.slice(0, 4).map((a) => (
              <Text key={a.name} size="sm"><b>{a.count.toLocaleString()}</b> <Text span ff="monospace" size="sm">{a.name}</Text></Text>
            ))}
          </Group>
          <SimpleGrid cols={{ base: 1, md: 3 }} spacing="md">
            <Box style={{ overflow: "hidden", gridColumn: "span 2" }} role="img"
                 aria-label={`Operations per ${u.bucket} by action: `
                   + u.actions.map((a) => `${a.count} ${a.name}`).join(", ")}>
              <BarChart h={200} type="stacked" withLegend legendProps={{ verticalAlign: "top", height: 32 }}
                        data={data} dataKey="when" series={series} tickLine="none" gridAxis="y"
                        xAxisProps={{ minTickGap: 24 }} yAxisProps={{ allowDecimals: false, width: 48 }} />
            </Box>
            <div>
              <Text size="sm" fw={600} mb={4}>{topTitle}</Text>
              <Table.ScrollContainer minWidth={0}>
                <Table fz="sm" verticalSpacing={2} withRowBorders={false} data-testid="usage-top">
                  <Table.Tbody>
                    {u.top.map((r) => (
                      <Table.Tr key={r.name}>
                        <Table.Td style={{ overflowWrap: "anywhere" }}>
                          <Anchor component={Link} to={topLink(r.name)} size="sm">{topName ? topName(r.name) : r.name}</Anchor>
                        </Table.Td>
                        <Table.Td ta="right" w={80}>{r.count.toLocaleString()}</Table.Td>
                      </Table.Tr>
                    ))}
                  </Table.Tbody>
                </Table>
              </Table.ScrollContainer>
            </div>
          </SimpleGrid>
        </Stack>
      )}
    </Panel>
  );
}

/** A key's operations over time by action, and the hosts, clients and users that used it most. */
export function KeyUsagePanel({ keyId }: { keyId: string }) {
  return (
    <UsageChart target={{ key_id: keyId }} title="Usage" topTitle="Used most by"
                topLink={(actor) => `/audit?${new URLSearchParams({ object_id: keyId, actor })}`} />
  );
}

function KeyName({ id }: { id: string }) {
  const k = useKey(id);
  return <>{k.data?.name ?? id}</>;
}

/** A host's (or KMIP client's) use of keys over time, and the keys it used most. */
export function ActorUsagePanel({ actor }: { actor: string }) {
  return (
    <UsageChart target={{ actor }} title="Key usage" topTitle="Keys used most"
                topLink={(id) => `/keys/${encodeURIComponent(id)}`} topName={(id) => <KeyName id={id} />} />
  );
}

/** The hours a host's timelines cover (heartbeats, guard points). */
export const TIMELINE_RANGES = { "24h": 24, "7d": 24 * 7 } as const;
export type TimelineRange = keyof typeof TIMELINE_RANGES;

/** The 24 hours / 7 days switch of a host's timelines. */
export function TimelineRangeControl({ value, onChange, label }: {
  value: TimelineRange; onChange: (r: TimelineRange) => void; label: string;
}) {
  return (
    <div role="group" aria-label={label}>
      <SegmentedControl size="xs" value={value} onChange={(v) => onChange(v as TimelineRange)}
                        data={[{ value: "24h", label: "24 hours" }, { value: "7d", label: "7 days" }]} />
    </div>
  );
}

/** One cell per hour: heard from (a heartbeat) or not. */
export function HeartbeatTimeline({ hostId }: { hostId: string }) {
  const [range, setRange] = useState<TimelineRange>("24h");
  const hours = TIMELINE_RANGES[range];
  const until = new Date(Math.ceil(Date.now() / 3_600_000) * 3_600_000);
  const since = new Date(until.getTime() - hours * 3_600_000);
  const q = useQuery({
    queryKey: ["hosts", "heartbeats", hostId, range, until.toISOString()],
    queryFn: () => call(api.GET("/api/v1/hosts/{host_id}/heartbeats", { params: {
      path: { host_id: hostId }, query: { since: since.toISOString(), until: until.toISOString() } } })),
    refetchInterval: 60_000,
    placeholderData: (prev) => prev,
  });
  const heard = (q.data ?? []).filter((h) => h.count > 0).length;
  return (
    <Panel title="Heartbeats" right={<TimelineRangeControl value={range} onChange={setRange} label="Timeline range" />}>
      {q.error ? <ErrorAlert error={q.error} /> : !q.data ? <Loading /> : (
        <Stack gap={6} data-testid="heartbeat-timeline" data-heard={heard} data-hours={q.data.length}>
          <Text size="sm">Heard from in <b>{heard}</b> of the last {q.data.length} hours</Text>
          <Box role="img" aria-label={`Heard from in ${heard} of the last ${q.data.length} hours`}
               style={{ display: "grid", gridTemplateColumns: `repeat(${q.data.length}, minmax(0, 1fr))`, gap: 1 }}>
            {q.data.map((h) => (
              <Tooltip key={h.hour} label={`${label(h.hour, "hour")} UTC: ${h.count ? `${h.count} heartbeats` : "not heard from"}`}>
                <Box h={22} style={{ borderRadius: 2, background: h.count ? "var(--mantine-color-teal-6)"
                                                                          : "var(--mantine-color-gray-4)" }} />
              </Tooltip>
            ))}
          </Box>
          <Group justify="space-between">
            <Text size="xs" c="dimmed">{label(q.data[0]?.hour ?? since.toISOString(), "hour")}</Text>
            <Group gap="md">
              <Group gap={4}><Box w={10} h={10} bg="teal.6" style={{ borderRadius: 2 }} /><Text size="xs">heard from</Text></Group>
              <Group gap={4}><Box w={10} h={10} bg="gray.4" style={{ borderRadius: 2 }} /><Text size="xs">no heartbeat</Text></Group>
            </Group>
            <Text size="xs" c="dimmed">now</Text>
          </Group>
        </Stack>
      )}
    </Panel>
  );
}
