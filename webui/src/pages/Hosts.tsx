import {
  Anchor, Button, Center, Group, Modal, Pagination, Paper, SegmentedControl, Select, Stack, Switch, Table, Text, TextInput,
  Title,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { notifications } from "@mantine/notifications";
import { IconPlus, IconSearch } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { Link, useSearchParams } from "react-router";
import { api, call, type EnrollmentToken, type Host } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { PageHeader } from "../components/PageHeader";
import {
  EmptyState, HostStatusBadge, Loading, TokenStateBadge, fmtRelative, fmtTime,
} from "../components/bits";
import { HOST_STATUSES, hostStatus, tokenState, type HostStatus } from "../hosts";
import { SortHeader, nextSort } from "../components/SortHeader";
import { qk, useEnrollmentTokens, useHostList, type HostSort } from "../queries";
import { EnrollHostDialog } from "./EnrollHost";

const PAGE = 50;
const HOST_SORTS = ["hostname", "host_group", "enrolled_at", "last_heartbeat_at", "agent_version"];

export function HostsPage() {
  const [params, setParams] = useSearchParams();
  const [q, setQ] = useState(params.get("q") ?? "");
  const [debouncedQ] = useDebouncedValue(q, 250);
  const urlQ = params.get("q") ?? "";
  useEffect(() => { setQ(urlQ); }, [urlQ]);
  const group = params.get("group") ?? "";
  const statusParam = params.get("status") ?? "";
  const status = (HOST_STATUSES as string[]).includes(statusParam) ? statusParam as HostStatus : undefined;
  const sortParam = params.get("sort") ?? "hostname";
  const sort = (HOST_SORTS.includes(sortParam.replace(/^-/, "")) ? sortParam : "hostname") as HostSort;
  const page = Number(params.get("page") ?? "1") || 1;
  const hosts = useHostList({ q: debouncedQ.trim(), group, status, sort, limit: PAGE, offset: (page - 1) * PAGE });
  const [enrolling, setEnrolling] = useState(false);

  const update = (changes: Record<string, string | undefined>) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) { if (v) next.set(k, v); else next.delete(k); }
    if (!("page" in changes)) next.delete("page");
    setParams(next, { replace: true });
  };
  const sortBy = (column: string) => {
    const next = nextSort(sort, column);
    update({ sort: next === "hostname" ? undefined : next });
  };

  const data = hosts.data;
  const shown = data?.items ?? [];
  const groups = data?.groups ?? [];
  const counts = { online: 0, offline: 0, revoked: 0, ...data?.counts } as Record<HostStatus, number>;
  const matching = counts.online + counts.offline + counts.revoked;
  const filtered = !!(debouncedQ.trim() || group || status);
  const pages = data ? Math.max(1, Math.ceil(data.total / PAGE)) : 1;

  return (
    <Stack gap="md">
      <PageHeader title="Hosts"
                  subtitle="Storage hosts running the Strongroom agent, each identified by its own certificate from the internal CA"
                  actions={<GuardedButton perm="hosts:enroll" mode="hide" color="ink" leftSection={<IconPlus size={16} />}
                                          onClick={() => setEnrolling(true)} data-testid="enroll-host">
                    Enroll a host</GuardedButton>} />
      <Paper withBorder radius="md" p="sm">
        <Group gap="sm" align="flex-end">
          <TextInput label="Search" placeholder="Hostname, group, IP address or OS" leftSection={<IconSearch size={14} />} w={260}
                     value={q} onChange={(e) => { setQ(e.currentTarget.value); update({ q: e.currentTarget.value || undefined }); }} />
          <Select label="Group" placeholder="Any group" clearable searchable data={groups} value={group || null} w={200}
                  onChange={(v) => update({ group: v ?? undefined })} nothingFoundMessage="No such group" />
          {/* The counts grow with the fleet: on a phone the control scrolls inside its own
              box rather than widening the page. */}
          <div style={{ maxWidth: "100%", overflowX: "auto" }}>
            <Text size="sm" fw={500} mb={4} id="host-status-label">Status</Text>
            <SegmentedControl aria-labelledby="host-status-label" size="sm" value={status ?? "all"}
                              onChange={(v) => update({ status: v === "all" ? undefined : v })}
                              data={[
                                { value: "all", label: `All (${matching})` },
                                { value: "online", label: `Online (${counts.online})` },
                                { value: "offline", label: `Offline (${counts.offline})` },
                                { value: "revoked", label: `Revoked (${counts.revoked})` },
                              ]} data-testid="host-status-filter" />
          </div>
          {filtered && <Button variant="subtle" color="gray"
                               onClick={() => { setQ(""); setParams({}, { replace: true }); }}>Clear filters</Button>}
        </Group>
      </Paper>
      <Paper withBorder radius="md">
        {hosts.error ? <ErrorAlert error={hosts.error} title="Hosts could not be loaded" />
          : hosts.isPending ? <Loading label="Loading hosts…" />
          : !filtered && data?.total === 0 ? <NoHostsYet onEnroll={() => setEnrolling(true)} />
          : shown.length === 0 ? <EmptyState title="No host matches these filters">Change or clear the filters.</EmptyState>
          : <HostsTable hosts={shown} sort={sort} onSort={sortBy} />}
      </Paper>
      {data && data.total > 0 && (
        <Group justify="space-between">
          <Text size="sm" c="dimmed" data-testid="hosts-total">
            {data.total <= PAGE ? `${data.total} hosts` : `${data.offset + 1}–${data.offset + shown.length} of ${data.total} hosts`}
            {" · "}offline means no heartbeat within three heartbeat intervals
          </Text>
          {pages > 1 && (
            <Pagination total={pages} value={page} onChange={(p) => update({ page: String(p) })} size="sm"
                        aria-label="Pages of hosts" getItemProps={(p) => ({ "aria-label": `Page ${p}` })}
                        getControlProps={(c) => ({ "aria-label": { first: "First page", previous: "Previous page",
                                                                    next: "Next page", last: "Last page" }[c] })} />
          )}
        </Group>
      )}
      <EnrollmentTokensSection />
      <EnrollHostDialog opened={enrolling} onClose={() => setEnrolling(false)} groups={groups} />
    </Stack>
  );
}

function NoHostsYet({ onEnroll }: { onEnroll: () => void }) {
  const { can } = useAuth();
  return (
    <Stack gap="xs" py="md" data-testid="no-hosts">
      <EmptyState title="No hosts enrolled yet">
        To enroll a host, create a one-time enrollment token for its host group, then run the installer
        one-liner on the host as root. The host makes its own key pair, receives a certificate from the
        internal CA and appears here; it can then fetch the keys tagged for its group.
      </EmptyState>
      <Center>
        {can("hosts:enroll")
          ? <Button color="ink" leftSection={<IconPlus size={16} />} onClick={onEnroll}>Enroll the first host</Button>
          : <Text size="sm" c="dimmed">Enrolling needs the hosts:enroll permission (operators and administrators).</Text>}
      </Center>
    </Stack>
  );
}

function HostsTable({ hosts, sort, onSort }: { hosts: Host[]; sort: string; onSort: (column: string) => void }) {
  return (
    <Table.ScrollContainer minWidth={900}>
      <Table highlightOnHover fz="sm" verticalSpacing={8} data-testid="hosts-table">
        <Table.Thead>
          <Table.Tr>
            <SortHeader label="Hostname" column="hostname" sort={sort} onSort={onSort} />
            <Table.Th>Status</Table.Th>
            <SortHeader label="Last heartbeat" column="last_heartbeat_at" sort={sort} onSort={onSort} />
            <SortHeader label="Group" column="host_group" sort={sort} onSort={onSort} />
            <Table.Th>OS</Table.Th>
            <SortHeader label="Agent" column="agent_version" sort={sort} onSort={onSort} />
            <Table.Th>Guard points</Table.Th>
            <SortHeader label="Enrolled" column="enrolled_at" sort={sort} onSort={onSort} />
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {hosts.map((h) => {
            const st = hostStatus(h);
            const errors = h.guard_points.filter((g) => g.state === "error").length;
            return (
              <Table.Tr key={h.id} data-host={h.hostname}>
                <Table.Td>
                  <Anchor component={Link} to={`/hosts/${h.id}`} fw={600} size="sm">{h.hostname}</Anchor>
                  {h.last_seen_ip && <Text size="xs" c="dimmed" ff="monospace">{h.last_seen_ip}</Text>}
                </Table.Td>
                <Table.Td title={st === "revoked" ? `revoked ${fmtTime(h.revoked_at)}` : undefined} style={{ minWidth: 90 }}>
                  <HostStatusBadge status={st} />
                </Table.Td>
                <Table.Td title={fmtTime(h.last_heartbeat_at)} style={{ whiteSpace: "nowrap" }}>
                  {h.last_heartbeat_at ? fmtRelative(h.last_heartbeat_at)
                    : <Text span size="sm" c="dimmed">never{st === "offline" ? " (awaiting the first)" : ""}</Text>}
                </Table.Td>
                <Table.Td><Text size="sm" ff="monospace">{h.host_group}</Text></Table.Td>
                <Table.Td>{h.os || <Text span size="sm" c="dimmed">—</Text>}</Table.Td>
                <Table.Td>{h.agent_version || <Text span size="sm" c="dimmed">—</Text>}</Table.Td>
                <Table.Td>
                  {h.guard_points.length === 0 ? <Text span size="sm" c="dimmed">none</Text> : (
                    <Group gap={6} wrap="nowrap">
                      <Text span size="sm">{h.guard_points.length}</Text>
                      {errors > 0 && <Text span size="xs" c="var(--sr-text-danger)" fw={600}>{errors} in error</Text>}
                    </Group>
                  )}
                </Table.Td>
                <Table.Td title={fmtTime(h.enrolled_at)} style={{ whiteSpace: "nowrap" }}>{fmtRelative(h.enrolled_at)}</Table.Td>
              </Table.Tr>
            );
          })}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

export function EnrollmentTokensSection() {
  const { can } = useAuth();
  const qc = useQueryClient();
  const tokens = useEnrollmentTokens();
  const [showInactive, setShowInactive] = useState(false);
  const [revoking, setRevoking] = useState<EnrollmentToken | null>(null);
  const revoke = useMutation({
    mutationFn: (t: EnrollmentToken) =>
      call(api.DELETE("/api/v1/enrollment-tokens/{token_id}", { params: { path: { token_id: t.id } } })),
    onSuccess: (t) => {
      void qc.invalidateQueries({ queryKey: qk.enrollmentTokens });
      notifications.show({ color: "teal", title: "Enrollment token revoked",
                           message: `${t.prefix}… can no longer enroll a host` });
      setRevoking(null);
    },
  });
  const all = tokens.data ?? [];
  const active = all.filter((t) => tokenState(t) === "active");
  const shown = showInactive ? all : active;
  const closeRevoke = () => { setRevoking(null); revoke.reset(); };

  return (
    <Paper withBorder radius="md" p="md" component="section" aria-labelledby="enrollment-tokens-title">
      <Group justify="space-between" mb="sm">
        <Stack gap={0}>
          <Title order={2} size="h5" id="enrollment-tokens-title">Enrollment tokens</Title>
          <Text size="xs" c="dimmed">One-time secrets a new host presents once to get its certificate. Only a prefix is kept visible.</Text>
        </Stack>
        <Switch label={`Show used, expired and revoked (${all.length - active.length})`} checked={showInactive}
                onChange={(e) => setShowInactive(e.currentTarget.checked)} data-testid="show-inactive-tokens" />
      </Group>
      {tokens.error ? <ErrorAlert error={tokens.error} title="Enrollment tokens could not be loaded" />
        : tokens.isPending ? <Loading label="Loading enrollment tokens…" />
        : shown.length === 0 ? (
          <EmptyState title={all.length ? "No active enrollment token" : "No enrollment tokens yet"}>
            {can("hosts:enroll") ? "“Enroll a host” creates one, for one host group, usable a set number of times until it expires."
              : "Operators and administrators create them with “Enroll a host”."}
          </EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={800}>
            <Table fz="sm" verticalSpacing={6} highlightOnHover data-testid="enrollment-tokens-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Token</Table.Th><Table.Th>Group</Table.Th><Table.Th>Uses</Table.Th><Table.Th>State</Table.Th>
                <Table.Th>Created by</Table.Th><Table.Th>Created</Table.Th><Table.Th>Expires</Table.Th><Table.Th />
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {shown.map((t) => {
                  const st = tokenState(t);
                  return (
                    <Table.Tr key={t.id} data-token={t.prefix}>
                      <Table.Td><Text size="sm" ff="monospace">{t.prefix}…</Text></Table.Td>
                      <Table.Td><Text size="sm" ff="monospace">{t.host_group}</Text></Table.Td>
                      <Table.Td>{t.uses} / {t.max_uses}</Table.Td>
                      <Table.Td style={{ minWidth: 96 }}><TokenStateBadge state={st} /></Table.Td>
                      <Table.Td>{t.created_by}</Table.Td>
                      <Table.Td title={fmtTime(t.created_at)} style={{ whiteSpace: "nowrap" }}>{fmtRelative(t.created_at)}</Table.Td>
                      <Table.Td title={fmtTime(t.expires_at)} style={{ whiteSpace: "nowrap" }}>
                        {t.revoked_at ? <Text span size="sm" c="dimmed">revoked {fmtRelative(t.revoked_at)}</Text> : fmtRelative(t.expires_at)}
                      </Table.Td>
                      <Table.Td>{can("hosts:enroll") && st === "active" && (
                        <Button size="compact-sm" variant="subtle" color="red" onClick={() => setRevoking(t)}
                                aria-label={`Revoke enrollment token ${t.prefix}`}>Revoke</Button>)}</Table.Td>
                    </Table.Tr>
                  );
                })}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      <Modal opened={!!revoking} onClose={closeRevoke} title={`Revoke enrollment token ${revoking?.prefix ?? ""}…`} centered>
        <Stack gap="sm">
          <Text size="sm">No host can enroll with this token from now on ({revoking ? revoking.max_uses - revoking.uses : 0} of
            its {revoking?.max_uses} uses are left). Hosts that already enrolled with it keep working: revoke those
            hosts on their own pages if they must go too.</Text>
          <ErrorAlert error={revoke.error} title="Token not revoked" />
          <Group justify="flex-end">
            <Button variant="default" onClick={closeRevoke}>Cancel</Button>
            <Button color="red" loading={revoke.isPending} onClick={() => revoking && revoke.mutate(revoking)}
                    data-testid="confirm-revoke-token">Revoke token</Button>
          </Group>
        </Stack>
      </Modal>
    </Paper>
  );
}
