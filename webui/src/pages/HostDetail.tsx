import { Alert, Anchor, Badge, Code, Grid, Group, Paper, SimpleGrid, Stack, Table, Text, Title } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconBan } from "@tabler/icons-react";
import { useMutation, useQueries, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type ReactNode } from "react";
import { Link, useParams } from "react-router";
import { api, call, type Host } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { PageHeader } from "../components/PageHeader";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import {
  CopyValue, EmptyState, GuardPointStateBadge, HostStatusBadge, Loading, OutcomeBadge, StateBadge, fmtRelative, fmtTime,
} from "../components/bits";
import { hostActor, hostGroupTag, hostStatus } from "../hosts";
import { qk, useHost, useKeys } from "../queries";
import { GuardPointTimeline } from "./GuardPointTimeline";
import { ActorUsagePanel, HeartbeatTimeline } from "./Usage";

const KEYS_SHOWN = 50;
const EVENTS_SHOWN = 25;

export function HostDetailPage() {
  const { hostId = "" } = useParams();
  const host = useHost(hostId);
  if (host.error) {
    return (
      <Stack>
        <Text size="sm"><Anchor component={Link} to="/hosts" underline="always">Hosts</Anchor> / {hostId}</Text>
        <ErrorAlert error={host.error} title="This host could not be loaded" />
      </Stack>
    );
  }
  if (host.isPending) return <Loading label="Loading host…" />;
  return <HostView h={host.data} />;
}

function HostView({ h }: { h: Host }) {
  const { can } = useAuth();
  const qc = useQueryClient();
  const [confirming, setConfirming] = useState(false);
  const status = hostStatus(h);
  const revoke = useMutation({
    mutationFn: () => call(api.POST("/api/v1/hosts/{host_id}/revoke", { params: { path: { host_id: h.id } } })),
    onSuccess: (updated) => {
      qc.setQueryData(qk.host(h.id), updated);
      void qc.invalidateQueries({ queryKey: qk.hostLists });
      // The audit chainer appends records a moment after the request commits.
      for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
      notifications.show({ color: "teal", title: "Host revoked", message: `${h.hostname} is refused from its next call` });
      setConfirming(false);
    },
  });
  return (
    <Stack gap="md">
      <Text size="sm"><Anchor component={Link} to="/hosts" underline="always">Hosts</Anchor> / {h.hostname}</Text>
      <PageHeader
        title={<Group gap="sm"><span data-testid="host-name">{h.hostname}</span><HostStatusBadge status={status} /></Group>}
        subtitle={<>Group <Code>{h.host_group}</Code> · enrolled {fmtTime(h.enrolled_at)}</>}
        actions={status !== "revoked" && (
          <GuardedButton perm="hosts:revoke" mode="hide" variant="outline" color="red" leftSection={<IconBan size={16} />}
                         onClick={() => setConfirming(true)} data-testid="revoke-host">Revoke host</GuardedButton>
        )}
      />
      {status === "revoked" && (
        <Alert color="red" variant="light" title={`Revoked ${fmtTime(h.revoked_at)}`} data-testid="host-revoked">
          The key server refuses this host's certificate. Its agent dropped its cached keys at its next call.
          To bring the machine back, enroll it again with a new enrollment token: it gets a new identity.
        </Alert>
      )}
      {status === "offline" && (
        <Alert color="orange" variant="light" title="Offline" data-testid="host-offline">
          {h.last_heartbeat_at
            ? <>No heartbeat since {fmtTime(h.last_heartbeat_at)} ({fmtRelative(h.last_heartbeat_at)}). Check that the
              agent runs on the host (<Code>systemctl status strongroom-agent</Code>) and can reach the agent port.</>
            : <>The agent has not sent its first heartbeat yet. Check that it runs on the host
              (<Code>systemctl status strongroom-agent</Code>) and can reach the agent port.</>}
        </Alert>
      )}
      <Grid gutter="md">
        <Grid.Col span={{ base: 12, lg: 5 }}>
          <Paper withBorder radius="md" p="md" h="100%">
            <Title order={2} size="h5" mb="sm">Identity</Title>
            <SimpleGrid cols={2} spacing={6} verticalSpacing={6} style={{ gridTemplateColumns: "140px minmax(0, 1fr)" }}
                        data-testid="host-identity">
              <Prop label="Hostname">{h.hostname}</Prop>
              <Prop label="Host ID"><Group gap={2} wrap="nowrap"><Code fz="xs" style={{ wordBreak: "break-all" }}>{h.id}</Code><CopyValue value={h.id} label="Copy host ID" /></Group></Prop>
              <Prop label="Group"><Code>{h.host_group}</Code></Prop>
              <Prop label="Certificate serial">
                <Group gap={2} wrap="nowrap"><Code fz="xs" style={{ wordBreak: "break-all" }}>{h.cert_serial}</Code>
                  <CopyValue value={h.cert_serial} label="Copy certificate serial" /></Group>
              </Prop>
              <Prop label="OS">{h.os || "—"}</Prop>
              <Prop label="Agent version">{h.agent_version || "—"}</Prop>
              <Prop label="Last seen from">{h.last_seen_ip ?? "—"}</Prop>
              <Prop label="Enrolled">{fmtTime(h.enrolled_at)}</Prop>
              <Prop label="Last heartbeat">
                {h.last_heartbeat_at ? `${fmtTime(h.last_heartbeat_at)} (${fmtRelative(h.last_heartbeat_at)})` : "never"}
              </Prop>
              {h.revoked_at && <Prop label="Revoked">{fmtTime(h.revoked_at)}</Prop>}
            </SimpleGrid>
          </Paper>
        </Grid.Col>
        <Grid.Col span={{ base: 12, lg: 7 }}>
          <Paper withBorder radius="md" p="md" h="100%">
            <Group justify="space-between" mb="sm">
              <Title order={2} size="h5">Guard points</Title>
              {h.last_heartbeat_at && <Text size="xs" c="dimmed">as reported {fmtRelative(h.last_heartbeat_at)}</Text>}
            </Group>
            <GuardPoints h={h} revoked={status === "revoked"} />
          </Paper>
        </Grid.Col>
      </Grid>
      <HeartbeatTimeline hostId={h.id} />
      {can("audit:read") && <GuardPointTimeline h={h} />}
      {can("audit:read") && <ActorUsagePanel actor={hostActor(h.hostname)} />}
      {can("keys:read") && <GroupKeys h={h} />}
      {can("audit:read") && <HostEvents h={h} />}
      <TypedConfirmDialog opened={confirming} onClose={() => { setConfirming(false); revoke.reset(); }}
                          title={`Revoke ${h.hostname}`} phrase={h.hostname} actionLabel="Revoke host"
                          busy={revoke.isPending} error={revoke.error} onConfirm={() => revoke.mutate()}>
        <Text size="sm">The key server refuses this host's certificate from its next call on (its next heartbeat,
          within a heartbeat interval). The agent then drops every key it has cached and stops: data under its
          guard points cannot be opened on this host any more.</Text>
        <Text size="sm" fw={600}>This cannot be undone. To bring the machine back, enroll it again with a new
          enrollment token.</Text>
      </TypedConfirmDialog>
    </Stack>
  );
}

function Prop({ label, children }: { label: string; children: ReactNode }) {
  return <><Text size="sm" c="dimmed">{label}</Text><Text size="sm" component="div" style={{ overflowWrap: "anywhere" }}>{children}</Text></>;
}

function GuardPoints({ h, revoked }: { h: Host; revoked: boolean }) {
  if (h.guard_points.length === 0) {
    return (
      <EmptyState title="No guard points reported">
        The agent reports its guard points (encrypted directories) with every heartbeat.
      </EmptyState>
    );
  }
  return (
    <Table.ScrollContainer minWidth={560}>
      <Table fz="sm" verticalSpacing={6} data-testid="guard-points">
        <Table.Thead><Table.Tr><Table.Th>Path</Table.Th><Table.Th>Key</Table.Th><Table.Th>State</Table.Th>
          <Table.Th>Detail</Table.Th></Table.Tr></Table.Thead>
        <Table.Tbody>
          {h.guard_points.map((g) => (
            <Table.Tr key={g.path}>
              <Table.Td><Text size="sm" ff="monospace">{g.path}</Text></Table.Td>
              <Table.Td style={{ whiteSpace: "nowrap" }}>
                <Anchor component={Link} to={`/keys/${encodeURIComponent(g.key)}`} size="sm">{g.key}</Anchor></Table.Td>
              <Table.Td style={{ minWidth: 104 }}>
                {/* A revoked host's agent drops its keys and stops: what it last reported is history. */}
                {revoked ? (
                  <Stack gap={2} data-testid="gp-state-revoked">
                    <Badge color="gray" variant="light" radius="sm">stopped</Badge>
                    <Text size="xs" c="dimmed">last reported {g.state}</Text>
                  </Stack>
                ) : <GuardPointStateBadge state={g.state} />}
              </Table.Td>
              <Table.Td><Text size="sm" c={g.state === "error" ? "var(--sr-text-danger)" : "dimmed"}>{g.detail || "—"}</Text>
                {g.rekey && <Text size="xs" c="dimmed" data-testid="rekey-progress">re-key {g.rekey.generation}: {g.rekey.done}/{g.rekey.total} files{g.rekey.finished ? ", finished" : ""}</Text>}
                {g.unprotect && <Text size="xs" c="dimmed" data-testid="unprotect-progress">unprotect {g.unprotect.generation}: {g.unprotect.done}/{g.unprotect.total} files{g.unprotect.finished ? ", finished" : ""}</Text>}</Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

function GroupKeys({ h }: { h: Host }) {
  const tag = hostGroupTag(h.host_group);
  const keys = useKeys({ tag, limit: KEYS_SHOWN, offset: 0 });
  // Guard points defined for this host or its group deliver their keys too.
  const gps = useQuery({ queryKey: ["guard-points"], queryFn: () => call(api.GET("/api/v1/guard-points")) });
  const viaGuardPoints = (gps.data ?? []).filter((g) => g.host_id === h.id || (!g.host_id && g.host_group === h.host_group));
  return (
    <Paper withBorder radius="md" p="md">
      <Group justify="space-between" mb="sm">
        <Stack gap={0}>
          <Title order={2} size="h5">Keys this host can receive</Title>
          <Text size="xs" c="dimmed">Keys tagged <Code>{tag}</Code>, re-wrapped in the HSM under the host's own public key when it asks.</Text>
        </Stack>
        <Anchor component={Link} to={`/keys?tag=${encodeURIComponent(tag)}`} size="sm">Open in keys</Anchor>
      </Group>
      {keys.error ? <ErrorAlert error={keys.error} /> : keys.isPending ? <Loading /> : keys.data.items.length === 0 ? (
        <EmptyState title="No key for this group">
          Tag a key with {tag} to deliver it to the hosts of group {h.host_group}.
        </EmptyState>
      ) : (
        <>
          <Table.ScrollContainer minWidth={560}>
            <Table fz="sm" verticalSpacing={6} data-testid="host-keys">
              <Table.Thead><Table.Tr><Table.Th>Key</Table.Th><Table.Th>State</Table.Th><Table.Th>Version</Table.Th>
                <Table.Th>Updated</Table.Th></Table.Tr></Table.Thead>
              <Table.Tbody>
                {keys.data.items.map((k) => (
                  <Table.Tr key={k.id}>
                    <Table.Td><Anchor component={Link} to={`/keys/${encodeURIComponent(k.name)}`} size="sm" fw={600}>{k.name}</Anchor></Table.Td>
                    <Table.Td><StateBadge state={k.state} /></Table.Td>
                    <Table.Td>v{k.current_version}</Table.Td>
                    <Table.Td title={fmtTime(k.updated_at)}>{fmtRelative(k.updated_at)}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
          {keys.data.total > keys.data.items.length && (
            <Text size="sm" c="dimmed" mt="xs">{keys.data.items.length} of {keys.data.total} shown.</Text>
          )}
        </>
      )}
      {viaGuardPoints.length > 0 && (
        <>
          <Text size="sm" fw={600} mt="md" mb={4}>Through its guard points</Text>
          <Table.ScrollContainer minWidth={560}>
            <Table fz="sm" verticalSpacing={6} data-testid="host-gp-keys">
              <Table.Thead><Table.Tr><Table.Th>Key</Table.Th><Table.Th>Guard point</Table.Th><Table.Th>For</Table.Th></Table.Tr></Table.Thead>
              <Table.Tbody>
                {viaGuardPoints.map((g) => (
                  <Table.Tr key={g.id}>
                    <Table.Td><Anchor component={Link} to={`/keys/${encodeURIComponent(g.key_name)}`} size="sm" fw={600}>{g.key_name}</Anchor></Table.Td>
                    <Table.Td><Text size="sm" ff="monospace">{g.path}</Text></Table.Td>
                    <Table.Td>{g.host_id ? "this host" : `group ${g.host_group}`}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        </>
      )}
    </Paper>
  );
}

function HostEvents({ h }: { h: Host }) {
  // The host's own calls are recorded with actor host:<hostname>; what was done to it
  // (enrollment, revocation, refused certificates) names it as the object: ask for both.
  // The API has no filter on details.host, so a page of the actor's records may hold
  // fewer than EVENTS_SHOWN of this host's when an earlier host had the same name.
  const queries = [{ actor: hostActor(h.hostname) }, { object_id: h.id }];
  const results = useQueries({
    queries: queries.map((f) => ({
      queryKey: ["audit", "list", { ...f, limit: EVENTS_SHOWN }],
      queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: { ...f, limit: EVENTS_SHOWN } } })),
    })),
  });
  const error = results.find((r) => r.error)?.error;
  const events = results.flatMap((r) => r.data?.items ?? [])
    // Hostnames are not unique (a machine enrolled again is a new host with the same
    // name): drop records that say they are about another host.
    .filter((e) => { const other = e.details?.host; return typeof other !== "string" || other === h.id; })
    .filter((e, i, all) => all.findIndex((x) => x.seq === e.seq) === i)
    .sort((a, b) => b.seq - a.seq).slice(0, EVENTS_SHOWN);
  return (
    <Paper withBorder radius="md" p="md">
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h5">Recent activity</Title>
        <Anchor component={Link} to={`/audit?actor=${encodeURIComponent(hostActor(h.hostname))}`} size="sm">Open in audit log</Anchor>
      </Group>
      {error ? <ErrorAlert error={error} /> : results.some((r) => r.isPending) ? <Loading /> : events.length === 0 ? (
        <EmptyState title="No recorded activity">Enrollment, key deliveries and the agent's own events appear here.</EmptyState>
      ) : (
        <Table.ScrollContainer minWidth={560}>
          <Table fz="sm" verticalSpacing={6} data-testid="host-events">
            <Table.Thead><Table.Tr><Table.Th>#</Table.Th><Table.Th>Time</Table.Th><Table.Th>Actor</Table.Th>
              <Table.Th>Action</Table.Th><Table.Th>Object</Table.Th><Table.Th>Outcome</Table.Th></Table.Tr></Table.Thead>
            <Table.Tbody>
              {events.map((e) => (
                <Table.Tr key={e.seq}>
                  <Table.Td><Anchor component={Link} to={`/audit?seq=${e.seq}`} size="sm">{e.seq}</Anchor></Table.Td>
                  <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtTime(e.time)}</Table.Td>
                  <Table.Td>{e.actor}</Table.Td>
                  <Table.Td><Text size="sm" ff="monospace">{e.action}</Text></Table.Td>
                  <Table.Td><Text size="xs" ff="monospace" lineClamp={1} maw={260}>
                    {e.object_type ? `${e.object_type}:` : ""}{e.object_id ?? "—"}</Text></Table.Td>
                  <Table.Td><OutcomeBadge outcome={e.outcome} /></Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Paper>
  );
}
