// Block volumes: LUKS2 volumes on hosts whose keyslot the key server seals. Hosts make
// and open them (`kms-agent volume …`); here people see where each is, how it is open,
// and revoke or re-key it (docs/volumes.md).
import { Alert, Anchor, Badge, Button, Code, Group, Paper, Progress, Select, SimpleGrid, Stack, Table, Text, Tooltip } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconInfoCircle, IconRefresh } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link, useParams } from "react-router";
import { api, call, type Schemas } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { PageHeader } from "../components/PageHeader";
import { Panel } from "../components/Panel";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { CopyValue, EmptyState, Loading, OutcomeBadge, fmtRelative, fmtTime } from "../components/bits";

type Volume = Schemas["VolumePublic"];
const QK = ["volumes"] as const;

const STATE_COLOR: Record<Volume["state"], string> = {
  created: "gray", open: "teal", closed: "blue", rekeying: "violet", revoked: "red",
};

export function VolumeStateBadge({ state }: { state: Volume["state"] }) {
  return <Badge color={STATE_COLOR[state]} variant="light" radius="sm" data-state={state}
                style={{ overflow: "visible" }}>{state}</Badge>;
}

export function fmtBytes(n: number | null | undefined): string {
  if (n == null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v >= 10 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

const GRACES: [number, string][] = [[0, "none: fail closed"], [3600, "1 hour"], [86_400, "1 day"], [604_800, "7 days"]];

/** A grace read exactly, in its largest units: 20 → "20 seconds", 5400 → "1 hour 30 minutes". */
export function graceLabel(seconds: number): string {
  const known = GRACES.find(([s]) => s === seconds);
  if (known) return known[1];
  const parts: string[] = [];
  let rest = seconds;
  for (const [size, unit] of [[86_400, "day"], [3600, "hour"], [60, "minute"], [1, "second"]] as const) {
    const n = Math.floor(rest / size);
    rest -= n * size;
    if (n > 0) parts.push(`${n} ${unit}${n === 1 ? "" : "s"}`);
  }
  return parts.join(" ");
}

/** How far a re-key is, or null when none is under way or asked for. */
export function rekeyStatus(v: Volume): { label: string; percent: number | null } | null {
  const r = v.rekey;
  if (r && !r.finished && r.generation > v.rekey_applied) {
    const total = r.total ?? 0;
    const percent = total > 0 ? Math.min(100, Math.round(((r.done ?? 0) / total) * 100)) : null;
    // The host reports a re-key that stopped (killed, rebooted) by leaving "rekeying":
    // the progress is where it stood, and only the host can resume it.
    if (v.state !== "rekeying") {
      const at = percent == null ? "" : ` at ${percent} %`;
      return { label: `re-key interrupted${at}: resume it on the host with kms-agent volume rekey ${v.name}`, percent };
    }
    return { label: percent == null ? "re-encrypting" : `re-encrypting: ${percent} %`, percent };
  }
  if (v.rekey_generation > v.rekey_applied) return { label: "re-key asked for: waiting for the host", percent: null };
  return null;
}

export function VolumesPage() {
  const volumes = useQuery({ queryKey: QK, queryFn: () => call(api.GET("/api/v1/volumes")), refetchInterval: 15_000 });
  return (
    <Stack gap="md">
      <PageHeader title="Volumes"
        subtitle="LUKS2 block volumes on your hosts. Each opens only when this server unseals its keyslot for the host it belongs to: revoke a volume, revoke its host or destroy its key, and it stays closed." />
      <Paper withBorder radius="md">
        {volumes.error ? <ErrorAlert error={volumes.error} /> : volumes.isPending ? <Loading /> : volumes.data.length === 0 ? (
          <EmptyState title="No volumes yet">
            On an enrolled host, <Code>kms-agent volume create NAME DEVICE --key KEY</Code> formats a device (or an
            image file with <Code>--size</Code>) as a volume sealed by this server.
          </EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={980}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="volumes-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Volume</Table.Th><Table.Th>Host</Table.Th><Table.Th>Device</Table.Th><Table.Th>Key</Table.Th>
                <Table.Th>Size</Table.Th><Table.Th>State</Table.Th><Table.Th>Last opened</Table.Th>
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {volumes.data.map((v) => {
                  const rk = rekeyStatus(v);
                  return (
                    <Table.Tr key={v.id} data-volume={v.name}>
                      <Table.Td><Anchor component={Link} to={`/volumes/${v.id}`} fw={600} ff="monospace" size="sm">{v.name}</Anchor>
                        {v.scope === "group" && <Text size="xs" c="dimmed">shared with group {v.host_group}</Text>}</Table.Td>
                      <Table.Td><Anchor component={Link} to={`/hosts/${v.host_id}`} size="sm">{v.hostname}</Anchor></Table.Td>
                      <Table.Td><Text size="sm" ff="monospace">{v.path}</Text></Table.Td>
                      <Table.Td><Anchor component={Link} to={`/keys/${encodeURIComponent(v.key_name)}`} size="sm">{v.key_name}</Anchor>
                        <Text size="xs" c="dimmed" span> v{v.key_version}</Text></Table.Td>
                      <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtBytes(v.size_bytes)}</Table.Td>
                      <Table.Td>
                        <Group gap={6} wrap="nowrap"><VolumeStateBadge state={v.state} />
                          {v.opened_by && <Text size="xs" c="dimmed">{v.opened_by}</Text>}</Group>
                        {rk && <Text size="xs" c="dimmed">{rk.label}</Text>}
                      </Table.Td>
                      <Table.Td style={{ whiteSpace: "nowrap" }} title={fmtTime(v.last_opened_at)}>{fmtRelative(v.last_opened_at)}</Table.Td>
                    </Table.Tr>
                  );
                })}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
    </Stack>
  );
}

function Fact({ label, children }: { label: string; children: React.ReactNode }) {
  return (
    <div>
      <Text size="xs" c="dimmed" tt="uppercase" fw={600}>{label}</Text>
      <Text size="sm" component="div">{children}</Text>
    </div>
  );
}

export function VolumeDetailPage() {
  const { volumeId = "" } = useParams();
  const { can } = useAuth();
  const qc = useQueryClient();
  const volume = useQuery({
    queryKey: [...QK, volumeId],
    queryFn: () => call(api.GET("/api/v1/volumes/{volume_id}", { params: { path: { volume_id: volumeId } } })),
    refetchInterval: (q) => (q.state.data && rekeyStatus(q.state.data) ? 3_000 : 15_000),
  });
  const events = useQuery({
    queryKey: ["audit", "volume", volumeId],
    queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: { object_id: volumeId, limit: 20 } } })),
    enabled: can("audit:read"),
    refetchInterval: 5_000, // records reach the chain a moment after the change that made them
  });
  const [revoking, setRevoking] = useState(false);
  const [rekeying, setRekeying] = useState(false);
  const done = (title: string, message: string) => {
    void qc.invalidateQueries({ queryKey: QK });
    void qc.invalidateQueries({ queryKey: ["audit", "volume", volumeId] });
    notifications.show({ color: "teal", title, message });
  };
  const revoke = useMutation({
    mutationFn: () => call(api.POST("/api/v1/volumes/{volume_id}/revoke", { params: { path: { volume_id: volumeId } } })),
    onSuccess: (v) => { setRevoking(false); done("Volume revoked", `${v.name}: the server refuses to unseal it from now on`); },
  });
  const policy = useMutation({
    mutationFn: (grace: number) => call(api.PUT("/api/v1/volumes/{volume_id}/policy", {
      params: { path: { volume_id: volumeId } }, body: { grace_seconds: grace } })),
    onSuccess: (v) => done("Offline grace changed", v.grace_seconds === 0
      ? `${v.name} opens only with this server's answer`
      : `${v.hostname} may open ${v.name} for ${graceLabel(v.grace_seconds)} after each unseal while this server is unreachable`),
  });
  const rekey = useMutation({
    mutationFn: () => call(api.POST("/api/v1/volumes/{volume_id}/rekey", { params: { path: { volume_id: volumeId } } })),
    onSuccess: (v) => { setRekeying(false); done("Re-key asked for", `${v.hostname} re-encrypts ${v.name} the next time it runs kms-agent volume rekey`); },
  });
  if (volume.error) return <ErrorAlert error={volume.error} />;
  if (volume.isPending) return <Loading />;
  const v = volume.data;
  const rk = rekeyStatus(v);
  const manage = can("volumes:manage") && v.state !== "revoked";
  return (
    <Stack gap="md">
      <Text size="sm"><Anchor component={Link} to="/volumes" underline="always">Volumes</Anchor> / {v.name}</Text>
      <PageHeader title={<Group gap="sm"><span>{v.name}</span><VolumeStateBadge state={v.state} /></Group>}
        subtitle={`${v.path} on ${v.hostname}`}
        actions={manage && (
          <Group gap="xs">
            <Button variant="default" leftSection={<IconRefresh size={16} />} onClick={() => { rekey.reset(); setRekeying(true); }}
                    data-testid="volume-rekey">Re-key…</Button>
            <Button color="red" variant="light" onClick={() => { revoke.reset(); setRevoking(true); }}
                    data-testid="volume-revoke">Revoke…</Button>
          </Group>
        )} />
      {v.state === "revoked" && (
        <Alert color="red" variant="light" icon={<IconInfoCircle size={18} />} title={`Revoked ${fmtRelative(v.revoked_at)}`}>
          The server refuses to unseal this volume: no host opens it again with the key server. Its recovery passphrase,
          if one was made, still opens it with cryptsetup alone.
        </Alert>
      )}
      {rk && (
        <Paper withBorder radius="md" p="md" data-testid="volume-rekey-progress">
          <Text size="sm" fw={600} mb={6}>{rk.label}</Text>
          <Progress value={rk.percent ?? 100} animated={rk.percent == null || rk.percent < 100} aria-label="Re-key progress" />
          {(v.rekey?.total ?? 0) > 0 && <Text size="xs" c="dimmed" mt={4}>{fmtBytes(v.rekey?.done)} of {fmtBytes(v.rekey?.total)}</Text>}
        </Paper>
      )}
      <Panel title="Volume">
        <SimpleGrid cols={{ base: 1, sm: 2, md: 3 }} spacing="md" p="md">
          <Fact label="Host"><Anchor component={Link} to={`/hosts/${v.host_id}`}>{v.hostname}</Anchor>
            {v.scope === "group" ? ` (any host of ${v.host_group})` : ""}</Fact>
          <Fact label="Device"><Code>{v.path}</Code></Fact>
          <Fact label="Size">{fmtBytes(v.size_bytes)} · {v.sector_size}-byte sectors · aes-xts-plain64</Fact>
          <Fact label="Sealed under"><Anchor component={Link} to={`/keys/${encodeURIComponent(v.key_name)}`}>{v.key_name}</Anchor> version {v.key_version}</Fact>
          <Fact label="LUKS2 UUID">{v.luks_uuid ? <Group gap={2} wrap="nowrap"><Code fz="xs">{v.luks_uuid}</Code><CopyValue value={v.luks_uuid} label="Copy the LUKS2 UUID" /></Group> : "—"}</Fact>
          <Fact label="Open">{v.state === "open" ? `yes, ${v.opened_by ?? ""}` : "no"} · last {fmtRelative(v.last_opened_at)}</Fact>
          <Fact label="Recovery passphrase">
            <Tooltip label="Made on the host with kms-agent volume recovery, shown there once; the server never sees it" multiline w={260} withArrow>
              <Text size="sm" span tabIndex={0} td="underline dotted">{v.has_recovery ? `made ${fmtRelative(v.recovery_created_at)}` : "none"}</Text>
            </Tooltip>
          </Fact>
          <Fact label="Offline grace">
            {manage ? (
              <Select size="xs" w={200} aria-label="Offline grace" allowDeselect={false} disabled={policy.isPending}
                      data={[...GRACES.map(([s, l]) => ({ value: String(s), label: l })),
                             ...(GRACES.some(([s]) => s === v.grace_seconds) ? [] : [{ value: String(v.grace_seconds), label: graceLabel(v.grace_seconds) }])]}
                      value={String(v.grace_seconds)} onChange={(x) => x != null && policy.mutate(Number(x))}
                      data-testid="volume-grace" />
            ) : graceLabel(v.grace_seconds)}
            {policy.error && <ErrorAlert error={policy.error} />}
          </Fact>
          <Fact label="Re-keys">{v.rekey_applied} done{v.rekey_generation > v.rekey_applied ? `, ${v.rekey_generation - v.rekey_applied} asked for` : ""}</Fact>
          <Fact label="Created">{fmtTime(v.created_at)} by {v.created_by}</Fact>
        </SimpleGrid>
      </Panel>
      {can("audit:read") && (
        <Panel title="Recent activity" right={<Anchor component={Link} to={`/audit?object_id=${v.id}`} size="sm">Open in the audit log</Anchor>}>
          {events.error ? <ErrorAlert error={events.error} /> : events.isPending ? <Loading /> : (
            <Table.ScrollContainer minWidth={560}>
              <Table fz="sm" verticalSpacing={6} data-testid="volume-events">
                <Table.Tbody>
                  {events.data.items.map((e) => (
                    <Table.Tr key={e.seq}>
                      <Table.Td style={{ whiteSpace: "nowrap" }} title={fmtTime(e.time)}>{fmtRelative(e.time)}</Table.Td>
                      <Table.Td><Code fz="xs">{e.action}</Code></Table.Td>
                      <Table.Td><OutcomeBadge outcome={e.outcome} /></Table.Td>
                      <Table.Td>{e.actor}</Table.Td>
                      <Table.Td><Text size="xs" c="dimmed">{typeof e.details?.reason === "string" ? e.details.reason : ""}</Text></Table.Td>
                    </Table.Tr>
                  ))}
                </Table.Tbody>
              </Table>
            </Table.ScrollContainer>
          )}
        </Panel>
      )}
      <TypedConfirmDialog opened={revoking} onClose={() => setRevoking(false)} title={`Revoke volume ${v.name}`}
        phrase={v.name} actionLabel="Revoke volume" busy={revoke.isPending} error={revoke.error} onConfirm={() => revoke.mutate()}>
        <Text size="sm">The server refuses to unseal this volume from now on: {v.hostname} cannot open it again, nor can
          any other host. If it is open now, it stays open until the host closes it. Only a recovery passphrase opens it
          afterwards. This cannot be undone.</Text>
      </TypedConfirmDialog>
      <TypedConfirmDialog opened={rekeying} onClose={() => setRekeying(false)} title={`Re-key volume ${v.name}`}
        phrase={v.name} actionLabel="Ask for a re-key" busy={rekey.isPending} error={rekey.error} onConfirm={() => rekey.mutate()}>
        <Text size="sm">{v.hostname} re-encrypts every sector under a new volume key the next time it runs
          <Code>kms-agent volume rekey {v.name}</Code> (offline: the volume is closed while it runs; resumable). Use it
          after a suspected exposure of the volume key. A recovery passphrase made before no longer opens the volume.</Text>
      </TypedConfirmDialog>
    </Stack>
  );
}
