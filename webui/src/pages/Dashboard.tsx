import { BarChart } from "@mantine/charts";
import { Anchor, Badge, Box, Button, Grid, Group, Paper, SimpleGrid, Stack, Table, Text } from "@mantine/core";
import { IconShieldCheck, IconShieldX } from "@tabler/icons-react";
import { useMutation, useQueries, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link } from "react-router";
import { KEY_STATES, api, call, type Host } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, STATE_COLOR, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { HOST_STATUSES, hostStatus, type HostStatus } from "../hosts";
import { Panel } from "../components/Panel";
import { useAuditStatus, useHosts } from "../queries";
import { AttentionPanel, AuditActivityPanel } from "./DashboardActivity";

const DUE_WINDOW_DAYS = 30;

export function DashboardPage() {
  const { can, me } = useAuth();
  return (
    <Stack gap="lg">
      <PageHeader title="Dashboard" subtitle={`Signed in as ${me?.username} (${me?.role})`} />
      <Grid gutter="lg">
        <Grid.Col span={12}><AttentionPanel /></Grid.Col>
        {can("audit:read") && <Grid.Col span={12}><AuditActivityPanel /></Grid.Col>}
        {can("keys:read") && <Grid.Col span={{ base: 12, md: 6, lg: 5 }}><KeysByState /></Grid.Col>}
        {can("hosts:read") && <Grid.Col span={{ base: 12, md: 6, lg: 4 }}><HostsSummary /></Grid.Col>}
        {can("audit:read") && <Grid.Col span={{ base: 12, md: 6, lg: 3 }}><ChainStatus /></Grid.Col>}
        {can("keys:read") && <Grid.Col span={{ base: 12, md: 6 }}><RotationsDue /></Grid.Col>}
        {can("audit:read") && <Grid.Col span={{ base: 12, md: 6 }}><RecentDenied /></Grid.Col>}
      </Grid>
    </Stack>
  );
}

function KeysByState() {
  const results = useQueries({
    queries: KEY_STATES.map((state) => ({
      queryKey: ["keys", "count", state],
      queryFn: () => call(api.GET("/api/v1/keys", { params: { query: { state, limit: 1 } } })),
    })),
  });
  const error = results.find((r) => r.error)?.error;
  const loading = results.some((r) => r.isPending);
  const data = KEY_STATES.map((state, i) => ({ state, keys: results[i].data?.total ?? 0 }));
  const total = data.reduce((a, d) => a + d.keys, 0);
  return (
    <Panel title="Keys by state" right={<Text size="sm" c="dimmed" data-testid="keys-total">{total} keys</Text>}>
      {error ? <ErrorAlert error={error} /> : loading ? <Loading /> : total === 0 ? (
        <EmptyState title="No keys yet">Create the first managed key on the Keys page.</EmptyState>
      ) : (
        <>
          {/* Clipped: the chart's hidden tooltip is laid out past its right edge, which on a
              phone made the whole page scroll sideways (the visible one stays inside). */}
          <Box style={{ overflow: "hidden" }} role="img" aria-label={
            `Keys by state: ${data.map((d) => `${d.state} ${d.keys}`).join(", ")}`}>
            <BarChart h={210} data={data} dataKey="state" orientation="vertical" withTooltip gridAxis="x"
                      tickLine="none" series={[{ name: "keys", color: "blue.8", label: "Keys" }]}
                      yAxisProps={{ width: 150 }} xAxisProps={{ allowDecimals: false }}
                      barProps={{ radius: 2 }} />
          </Box>
          <Group gap="xs" mt="xs">
            {data.filter((d) => d.keys > 0).map((d) => (
              <Anchor key={d.state} component={Link} to={`/keys?state=${d.state}`} size="xs">
                <Badge color={STATE_COLOR[d.state]} variant="light" radius="sm">{d.state}: {d.keys}</Badge>
              </Anchor>
            ))}
          </Group>
        </>
      )}
    </Panel>
  );
}

const HOST_TILE: Record<HostStatus, { label: string; color: string }> = {
  online: { label: "Online", color: "var(--sr-text-ok)" },
  offline: { label: "Offline", color: "var(--sr-text-warning)" },
  revoked: { label: "Revoked", color: "var(--sr-text-danger)" },
};
const ATTENTION_SHOWN = 5;

/** Why an active host needs a look: offline, or a guard point in error. */
export function hostAttention(h: Host): string | null {
  if (hostStatus(h) === "revoked") return null;
  const errors = h.guard_points.filter((g) => g.state === "error").length;
  const gp = errors ? `${errors} guard point${errors === 1 ? "" : "s"} in error` : null;
  if (!h.online) {
    const why = h.last_heartbeat_at ? `no heartbeat for ${fmtRelative(h.last_heartbeat_at).replace(/ ago$/, "")}`
      : "never sent a heartbeat";
    return gp ? `${why}; ${gp}` : why;
  }
  return gp;
}

export function HostsSummary() {
  const q = useHosts();
  const hosts = q.data?.items ?? [];
  const counts = { online: 0, offline: 0, revoked: 0, ...q.data?.counts } as Record<HostStatus, number>;
  const attention = hosts.flatMap((h) => {
    const why = hostAttention(h);
    return why ? [{ h, why }] : [];
  });
  return (
    <Panel title="Hosts" right={<Anchor component={Link} to="/hosts" size="sm">All hosts</Anchor>}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending ? <Loading /> : hosts.length === 0 ? (
        <EmptyState title="No hosts enrolled">Enroll the first storage host on the Hosts page.</EmptyState>
      ) : (
        <Stack gap="md">
          <SimpleGrid cols={3} spacing="sm">
            {HOST_STATUSES.map((s) => (
              <Anchor key={s} component={Link} to={`/hosts?status=${s}`} underline="never" c="inherit"
                      title={`${counts[s]} ${s} hosts`}>
                <Paper withBorder radius="sm" px="sm" py={8} data-testid={`hosts-${s}`} data-count={counts[s]}>
                  <Text fz={26} fw={700} lh={1.15} c={counts[s] ? HOST_TILE[s].color : "dimmed"}>{counts[s]}</Text>
                  <Text size="sm" c="dimmed">{HOST_TILE[s].label}</Text>
                </Paper>
              </Anchor>
            ))}
          </SimpleGrid>
          {attention.length === 0 ? (
            <Text size="sm" c="dimmed">Every active host is online, with no guard point in error.</Text>
          ) : (
            <Stack gap={6} data-testid="hosts-attention">
              <Text size="sm" fw={600}>Needs attention</Text>
              {attention.slice(0, ATTENTION_SHOWN).map(({ h, why }) => (
                <Stack key={h.id} gap={0}>
                  <Anchor component={Link} to={`/hosts/${h.id}`} size="sm" truncate="end">{h.hostname}</Anchor>
                  <Text size="xs" c={why.includes("error") ? "var(--sr-text-danger)" : "var(--sr-text-warning)"}>{why}</Text>
                </Stack>
              ))}
              {attention.length > ATTENTION_SHOWN && (
                <Text size="xs" c="dimmed">and {attention.length - ATTENTION_SHOWN} more</Text>
              )}
            </Stack>
          )}
        </Stack>
      )}
    </Panel>
  );
}

function RotationsDue() {
  // Soonest first from the server (keys with no schedule come last): one short page.
  const q = useQuery({
    queryKey: ["keys", "list", { limit: 8, offset: 0, state: "active", sort: "next_rotation_at" }],
    queryFn: () => call(api.GET("/api/v1/keys", { params: { query: { state: "active", limit: 8, sort: "next_rotation_at" } } })),
  });
  const horizon = Date.now() + DUE_WINDOW_DAYS * 86_400_000;
  const due = (q.data?.items ?? [])
    .filter((k) => k.next_rotation_at && new Date(k.next_rotation_at).getTime() <= horizon)
    .sort((a, b) => (a.next_rotation_at ?? "").localeCompare(b.next_rotation_at ?? ""))
    .slice(0, 8);
  return (
    <Panel title={`Rotations due in ${DUE_WINDOW_DAYS} days`}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending ? <Loading /> : due.length === 0 ? (
        <EmptyState title="Nothing due">No active key has a scheduled rotation in the next {DUE_WINDOW_DAYS} days.</EmptyState>
      ) : (
        <Table.ScrollContainer minWidth={320}>
        <Table fz="sm" verticalSpacing={6}>
          <Table.Thead><Table.Tr><Table.Th>Key</Table.Th><Table.Th>Version</Table.Th><Table.Th>Due</Table.Th></Table.Tr></Table.Thead>
          <Table.Tbody>
            {due.map((k) => (
              <Table.Tr key={k.id}>
                <Table.Td><Anchor component={Link} to={`/keys/${encodeURIComponent(k.name)}`} size="sm">{k.name}</Anchor></Table.Td>
                <Table.Td>v{k.current_version}</Table.Td>
                <Table.Td title={fmtTime(k.next_rotation_at)}>{fmtRelative(k.next_rotation_at)}</Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
        </Table.ScrollContainer>
      )}
    </Panel>
  );
}

function RecentDenied() {
  const q = useQuery({
    queryKey: ["audit", "list", { outcome: "denied", limit: 8 }],
    queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: { outcome: "denied", limit: 8 } } })),
  });
  return (
    <Panel title="Recent denied accesses"
           right={<Anchor component={Link} to="/audit?outcome=denied" size="sm">All denied</Anchor>}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending ? <Loading /> : q.data.items.length === 0 ? (
        <EmptyState title="No denied accesses">Refused requests will appear here.</EmptyState>
      ) : (
        <Table.ScrollContainer minWidth={320}>
        <Table fz="sm" verticalSpacing={6} data-testid="recent-denied">
          <Table.Thead><Table.Tr><Table.Th>Time</Table.Th><Table.Th>Actor</Table.Th><Table.Th>Action</Table.Th></Table.Tr></Table.Thead>
          <Table.Tbody>
            {q.data.items.map((e) => (
              <Table.Tr key={e.seq}>
                <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtRelative(e.time)}</Table.Td>
                <Table.Td style={{ overflowWrap: "anywhere" }}>{e.actor}</Table.Td>
                <Table.Td><Text size="sm" ff="monospace" style={{ overflowWrap: "anywhere" }}>{e.action}</Text></Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
        </Table.ScrollContainer>
      )}
    </Panel>
  );
}

// The last signed checkpoint and how far the chain was last verified: read, never
// re-walked on page load (a full walk is O(log) — minutes at a year's volume).
export function ChainStatus() {
  const { can } = useAuth();
  const q = useAuditStatus();
  const qc = useQueryClient();
  const verify = useMutation({
    mutationFn: () => call(api.POST("/api/v1/audit/verify")),
    onSettled: () => qc.invalidateQueries({ queryKey: ["audit", "status"] }),
  });
  const st = q.data;
  const behind = st?.verified ? st.head_seq - st.verified.seq : st?.head_seq ?? 0;
  return (
    <Panel title="Audit chain"
           right={can("audit:verify") ? <Button size="xs" variant="default" loading={verify.isPending}
                                                onClick={() => verify.mutate()}>Verify now</Button> : undefined}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending || !st ? <Loading label="Reading the chain's status…" /> : (
        <Stack gap={6} data-testid="chain-status">
          {verify.error ? <ErrorAlert error={verify.error} /> : verify.data ? <VerifyResultView result={verify.data} /> : (
            <Group gap="xs">
              {st.verified ? <IconShieldCheck color="var(--mantine-color-teal-7)" size={28} />
                : <IconShieldX color="var(--mantine-color-yellow-8)" size={28} />}
              <Text fw={700} c={st.verified ? "var(--sr-text-ok)" : "var(--sr-text-caution)"}>
                {st.verified ? "Verified to checkpoint #" + st.verified.checkpoint : "Not verified yet"}
              </Text>
            </Group>
          )}
          <SimpleGrid cols={2} spacing={4}>
            <Text size="sm" c="dimmed">Head record</Text><Text size="sm">#{st.head_seq}</Text>
            <Text size="sm" c="dimmed">Last checkpoint</Text>
            <Text size="sm">{st.last_checkpoint
              ? <>#{st.last_checkpoint.checkpoint} at record {st.last_checkpoint.seq}, {fmtRelative(st.last_checkpoint.time)}</>
              : "none yet"}</Text>
            <Text size="sm" c="dimmed">Last verified</Text>
            <Text size="sm">{st.verified ? fmtRelative(st.verified.at) : "never"}</Text>
            <Text size="sm" c="dimmed">After that checkpoint</Text><Text size="sm">{behind} records</Text>
          </SimpleGrid>
          <Text size="xs" c="dimmed" title={st.key_fingerprint}>
            Checkpoints are signed in the HSM (ECDSA P-256, key {st.key_fingerprint.slice(0, 16)}…); keep the
            sinks' copies to check them from outside.
          </Text>
        </Stack>
      )}
    </Panel>
  );
}

// Shown one by one up to this many: a version used many times after its statement makes a
// problem per use, and `keyserver verify-audit` prints every one.
const PROBLEMS_SHOWN = 10;

export function VerifyResultView({ result }: { result: { ok: boolean; checked: number; head_seq: number; first_broken_seq?: number | null; reason?: string | null; from_seq?: number; statements?: number; problems?: { seq: number; reason: string }[] } }) {
  const problems = result.problems ?? [];
  return (
    <Stack gap={6} data-testid="verify-result" data-ok={result.ok}>
      <Group gap="xs">
        {result.ok ? <IconShieldCheck color="var(--mantine-color-teal-7)" size={28} />
          : <IconShieldX color="var(--mantine-color-red-7)" size={28} />}
        <Text fw={700} c={result.ok ? "var(--sr-text-ok)" : "var(--sr-text-danger)"}>
          {result.ok ? "Intact" : "BROKEN"}
        </Text>
      </Group>
      <SimpleGrid cols={2} spacing={4}>
        <Text size="sm" c="dimmed">Records checked</Text>
        <Text size="sm">{result.checked}{result.from_seq ? ` (after record #${result.from_seq})` : ""}</Text>
        <Text size="sm" c="dimmed">Head sequence</Text><Text size="sm">{result.head_seq}</Text>
        {!!result.statements && <><Text size="sm" c="dimmed">Zero-use statements</Text>
          <Text size="sm">{result.statements}{result.ok ? " signed, no later use" : ""}</Text></>}
        {!result.ok && <><Text size="sm" c="dimmed">First broken record</Text>
          <Anchor component={Link} to={`/audit?seq=${result.first_broken_seq}`} size="sm">#{result.first_broken_seq}</Anchor></>}
      </SimpleGrid>
      {problems.length ? (
        <Stack gap={2} data-testid="verify-problems">
          {problems.slice(0, PROBLEMS_SHOWN).map((p, i) => (
            <Text key={i} size="sm" c="var(--sr-text-danger)">
              <Anchor component={Link} to={`/audit?seq=${p.seq}`} size="sm">#{p.seq}</Anchor> {p.reason}
            </Text>
          ))}
          {problems.length > PROBLEMS_SHOWN && <Text size="sm" c="var(--sr-text-danger)">
            … and {problems.length - PROBLEMS_SHOWN} more (keyserver verify-audit lists every one)</Text>}
        </Stack>
      ) : result.reason && <Text size="sm" c="var(--sr-text-danger)">{result.reason}</Text>}
      <Text size="xs" c="dimmed">Every checkpoint's signature is checked, and each record's HMAC since the last
        verified checkpoint is recomputed with the key held in the HSM.</Text>
    </Stack>
  );
}

