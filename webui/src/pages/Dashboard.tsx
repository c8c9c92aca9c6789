import { BarChart } from "@mantine/charts";
import { Anchor, Badge, Button, Grid, Group, Paper, SimpleGrid, Stack, Table, Text, Title } from "@mantine/core";
import { IconShieldCheck, IconShieldX } from "@tabler/icons-react";
import { useQueries, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link } from "react-router";
import { KEY_STATES, api, call } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, STATE_COLOR, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";

const DUE_WINDOW_DAYS = 30;

export function DashboardPage() {
  const { can, me } = useAuth();
  return (
    <Stack gap="lg">
      <PageHeader title="Dashboard" subtitle={`Signed in as ${me?.username} (${me?.role})`} />
      <Grid gutter="lg">
        {can("keys:read") && <Grid.Col span={{ base: 12, md: 7 }}><KeysByState /></Grid.Col>}
        {can("audit:verify") && <Grid.Col span={{ base: 12, md: 5 }}><ChainStatus /></Grid.Col>}
        {can("keys:read") && <Grid.Col span={{ base: 12, md: 6 }}><RotationsDue /></Grid.Col>}
        {can("audit:read") && <Grid.Col span={{ base: 12, md: 6 }}><RecentDenied /></Grid.Col>}
      </Grid>
    </Stack>
  );
}

export function Panel({ title, children, right }: { title: string; children: React.ReactNode; right?: React.ReactNode }) {
  return (
    <Paper withBorder radius="md" p="md" h="100%">
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h5">{title}</Title>
        {right}
      </Group>
      {children}
    </Paper>
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
          <BarChart h={210} data={data} dataKey="state" orientation="vertical" withTooltip gridAxis="x"
                    tickLine="none" series={[{ name: "keys", color: "blue.8", label: "Keys" }]}
                    yAxisProps={{ width: 150 }} xAxisProps={{ allowDecimals: false }}
                    barProps={{ radius: 2 }} aria-label="Keys by state" />
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

function RotationsDue() {
  // The API has no "due before" filter or sort: fetch a page and select here.
  const q = useQuery({
    queryKey: ["keys", "list", { limit: 500, offset: 0, state: "active" }],
    queryFn: () => call(api.GET("/api/v1/keys", { params: { query: { state: "active", limit: 500 } } })),
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
        <Table fz="sm" verticalSpacing={6} data-testid="recent-denied">
          <Table.Thead><Table.Tr><Table.Th>Time</Table.Th><Table.Th>Actor</Table.Th><Table.Th>Action</Table.Th></Table.Tr></Table.Thead>
          <Table.Tbody>
            {q.data.items.map((e) => (
              <Table.Tr key={e.seq}>
                <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtRelative(e.time)}</Table.Td>
                <Table.Td>{e.actor}</Table.Td>
                <Table.Td><Text size="sm" ff="monospace">{e.action}</Text></Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      )}
    </Panel>
  );
}

export function useVerifyChain(auto: boolean) {
  return useQuery({
    queryKey: ["audit", "verify"],
    queryFn: () => call(api.POST("/api/v1/audit/verify")),
    enabled: auto,
    staleTime: 5 * 60_000,
    refetchOnWindowFocus: false,
    retry: false,
  });
}

function ChainStatus() {
  const q = useVerifyChain(true);
  const qc = useQueryClient();
  return (
    <Panel title="Audit chain"
           right={<Button size="xs" variant="default" loading={q.isFetching}
                          onClick={() => qc.invalidateQueries({ queryKey: ["audit", "verify"] })}>Verify now</Button>}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending ? <Loading label="Verifying the chain…" /> : (
        <VerifyResultView result={q.data} />
      )}
    </Panel>
  );
}

export function VerifyResultView({ result }: { result: { ok: boolean; checked: number; head_seq: number; first_broken_seq?: number | null; reason?: string | null } }) {
  return (
    <Stack gap={6} data-testid="verify-result" data-ok={result.ok}>
      <Group gap="xs">
        {result.ok ? <IconShieldCheck color="var(--mantine-color-teal-7)" size={28} />
          : <IconShieldX color="var(--mantine-color-red-7)" size={28} />}
        <Text fw={700} c={result.ok ? "teal.8" : "red.8"}>
          {result.ok ? "Intact" : "BROKEN"}
        </Text>
      </Group>
      <SimpleGrid cols={2} spacing={4}>
        <Text size="sm" c="dimmed">Records checked</Text><Text size="sm">{result.checked}</Text>
        <Text size="sm" c="dimmed">Head sequence</Text><Text size="sm">{result.head_seq}</Text>
        {!result.ok && <><Text size="sm" c="dimmed">First broken record</Text>
          <Anchor component={Link} to={`/audit?seq=${result.first_broken_seq}`} size="sm">#{result.first_broken_seq}</Anchor></>}
      </SimpleGrid>
      {result.reason && <Text size="sm" c="red.8">{result.reason}</Text>}
      <Text size="xs" c="dimmed">Each record's HMAC is recomputed with the key held in the HSM.</Text>
    </Stack>
  );
}

