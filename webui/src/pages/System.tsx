import { Alert, Badge, Button, Group, Modal, Paper, Progress, SimpleGrid, Stack, Table, Text, Title, Tooltip } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconRefresh } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { api, call, type Schemas } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { PageHeader } from "../components/PageHeader";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { Loading, fmtRelative, fmtTime } from "../components/bits";
import { qk } from "../queries";

type Kek = Schemas["KekPublic"];
type Health = Schemas["SystemHealth"];
type Rotation = Schemas["KekRotationPublic"];

/** What a KEK wraps, by kind, in the words the server's refusals use. */
export const KIND_TITLES: Record<string, string> = {
  key_versions: "Key versions",
  kmip_objects: "KMIP private keys, secret data, opaque objects",
  ca: "The internal CA's key",
  totp_secrets: "Second-factor (TOTP) secrets",
  xks_credentials: "AWS XKS proxy credentials (sealed SigV4 secrets)",
  xks_previous_credentials: "AWS XKS proxy credentials being rotated out",
};

const KEK_STATE: Record<Kek["state"], { color: string; hint: string }> = {
  active: { color: "teal", hint: "wraps everything stored from now on" },
  retiring: { color: "blue", hint: "a rotation away from it is running; it still serves reads" },
  superseded: { color: "yellow", hint: "rotated away from; still in the token until retired" },
  retired: { color: "gray", hint: "removed from the token" },
};

const ROTATION_REFRESH_MS = 1000;
const HEALTH_REFRESH_MS = 15_000;

const HEALTH_STATUS: Record<Health["status"], { color: string; label: string }> = {
  ok: { color: "teal", label: "Healthy" },
  degraded: { color: "orange", label: "Degraded" },
  unavailable: { color: "red", label: "Not ready" },
};
const CHECK_TITLES: Record<string, string> = { database: "Database", hsm: "HSM", audit_sinks: "Audit sinks" };

function HealthSection({ h }: { h: Health }) {
  const st = HEALTH_STATUS[h.status];
  return (
    <SimpleGrid cols={{ base: 1, md: 2 }} spacing="md" data-testid="system-health">
      <Paper withBorder radius="md" p="md">
        <Group justify="space-between" mb="xs">
          <Title order={2} size="h4">Health</Title>
          <Badge color={st.color} variant="light" radius="sm" data-status={h.status}>{st.label}</Badge>
        </Group>
        <Table.ScrollContainer minWidth={0}>
          <Table fz="sm" verticalSpacing={4} withRowBorders={false}>
            <Table.Tbody>
              {h.checks.map((c) => (
                <Table.Tr key={c.name} data-check={c.name}>
                  <Table.Td w={120}>{CHECK_TITLES[c.name] ?? c.name}</Table.Td>
                  <Table.Td><Badge color={c.ok ? "teal" : "red"} variant="light" radius="sm">{c.ok ? "ok" : "failing"}</Badge></Table.Td>
                  <Table.Td c={c.ok ? "dimmed" : undefined}>{c.ok ? (c.latency_ms !== null ? `${c.latency_ms} ms` : "") : c.detail}</Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
        <Text size="xs" c="dimmed" mt="xs">
          Answered by {h.hostname} (pid {h.pid}, {h.workers} worker{h.workers === 1 ? "" : "s"}), Strongroom {h.version},
          {" "}{h.store === "embedded" ? "embedded store" : "PostgreSQL"}, up since {fmtTime(h.started_at)}
        </Text>
      </Paper>
      <Paper withBorder radius="md" p="md">
        <Title order={2} size="h4" mb="xs">Audit chain</Title>
        <Table.ScrollContainer minWidth={0}>
          <Table fz="sm" verticalSpacing={4} withRowBorders={false}>
            <Table.Tbody>
              <Table.Tr><Table.Td w={160} c="dimmed">Head</Table.Td><Table.Td>record {h.audit_head_seq.toLocaleString()}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">Not yet chained</Table.Td><Table.Td>{h.audit_pending.toLocaleString()}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">Last checkpoint</Table.Td><Table.Td>{h.audit_last_checkpoint_at ? fmtTime(h.audit_last_checkpoint_at) : "none yet"}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">Verified up to</Table.Td><Table.Td>{h.audit_verified_seq ? `record ${h.audit_verified_seq.toLocaleString()}` : "never verified"}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">When no sink accepts</Table.Td><Table.Td>{h.audit_fail_closed ? "key operations wait (fail-closed)" : "key operations go on"}</Table.Td></Table.Tr>
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
        {h.sinks.length === 0 ? (
          <Text size="sm" c="dimmed" mt="xs">No audit sinks: the chain is only in this database. See docs/audit.md to copy it off the server.</Text>
        ) : (
          <Table.ScrollContainer minWidth={560}>
            <Table fz="sm" verticalSpacing={4} mt="xs" data-testid="audit-sinks">
              <Table.Thead><Table.Tr><Table.Th>Sink</Table.Th><Table.Th>State</Table.Th><Table.Th>Behind</Table.Th><Table.Th>Last delivery</Table.Th></Table.Tr></Table.Thead>
              <Table.Tbody>
                {h.sinks.map((k) => (
                  <Table.Tr key={k.name}>
                    <Table.Td>{k.name} <Text span size="xs" c="dimmed">({k.kind})</Text></Table.Td>
                    <Table.Td>
                      <Badge color={k.healthy ? "teal" : "red"} variant="light" radius="sm">{k.healthy ? "delivering" : "failing"}</Badge>
                      {k.last_error && !k.healthy && <Text size="xs" c="var(--sr-text-danger)">{k.last_error}</Text>}
                    </Table.Td>
                    <Table.Td>{k.backlog.toLocaleString()} records</Table.Td>
                    <Table.Td>{k.delivered_at ? fmtRelative(k.delivered_at) : "never"}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
      <Replicas h={h} />
    </SimpleGrid>
  );
}

/** Every key server process heard from in the last day: during a rolling upgrade, which
 *  still run the old version; after a crash, which one is gone. */
function Replicas({ h }: { h: Health }) {
  const versions = new Set(h.replicas.filter((r) => r.live).map((r) => r.version));
  return (
    <Paper withBorder radius="md" p="md" style={{ gridColumn: "1 / -1" }}>
      <Group justify="space-between" mb="xs">
        <Title order={2} size="h4">Replicas</Title>
        {versions.size > 1 && (
          <Badge color="orange" variant="light" radius="sm" data-testid="mixed-versions">
            {versions.size} versions running</Badge>
        )}
      </Group>
      {h.replicas.length === 0 ? (
        <Text size="sm" c="dimmed">No replica has reported yet: each reports every scheduler interval (30 s by default).</Text>
      ) : (
        <Table.ScrollContainer minWidth={640}>
          <Table fz="sm" verticalSpacing={4} data-testid="replicas">
            <Table.Thead><Table.Tr><Table.Th>Host</Table.Th><Table.Th>State</Table.Th><Table.Th>Version</Table.Th>
              <Table.Th>Started</Table.Th><Table.Th>Last report</Table.Th><Table.Th>Scheduler</Table.Th></Table.Tr></Table.Thead>
            <Table.Tbody>
              {h.replicas.map((r) => (
                <Table.Tr key={r.id} data-replica={r.id} data-live={r.live}>
                  <Table.Td>{r.hostname} <Text span size="xs" c="dimmed">pid {r.pid}</Text>
                    {r.id === h.replica_id && <Text span size="xs" c="dimmed"> · answered this page</Text>}</Table.Td>
                  <Table.Td><Badge color={r.live ? "teal" : "gray"} variant="light" radius="sm">{r.live ? "live" : "gone"}</Badge></Table.Td>
                  <Table.Td>{r.version}</Table.Td>
                  <Table.Td title={fmtTime(r.started_at)}>{fmtRelative(r.started_at)}</Table.Td>
                  <Table.Td title={fmtTime(r.last_seen_at)}>{fmtRelative(r.last_seen_at)}</Table.Td>
                  <Table.Td data-testid="replica-scheduler">
                    {r.scheduler_error
                      ? <Text size="sm" c="var(--sr-text-danger)">failing, retried each interval: {r.scheduler_error}</Text>
                      : <Text size="sm" c="dimmed">ran at the last report</Text>}
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Paper>
  );
}

function wrappedTotal(k: Kek): number {
  return Object.values(k.wrapped ?? {}).reduce((a, b) => a + b, 0);
}

/** Why a KEK cannot be retired now, or null when it can. */
export function retireBlockedBy(k: Kek, rotation: Rotation | null | undefined): string | null {
  if (k.state === "active") return "This is the active KEK: rotate to a new one first.";
  if (k.state === "retiring" || rotation?.state === "running") {
    return "A KEK rotation is running: retire once it has finished.";
  }
  const n = wrappedTotal(k);
  if (n > 0) return `It still wraps ${n.toLocaleString()} stored item${n === 1 ? "" : "s"}: rotate the KEK again to re-wrap them, then retire it.`;
  return null;
}

function RotationCard({ rotation }: { rotation: Rotation }) {
  const running = rotation.state === "running";
  const pct = rotation.total ? Math.round((100 * rotation.done) / rotation.total) : 100;
  return (
    <Paper withBorder radius="md" p="md" data-testid="kek-rotation">
      <Group justify="space-between" mb="xs" wrap="wrap">
        <Title order={2} size="h4">{running ? "Rotation in progress" : "Last rotation"}</Title>
        <Badge color={running ? "blue" : rotation.state === "completed" ? "teal" : "red"} variant="light" radius="sm"
               data-state={rotation.state}>{rotation.state}</Badge>
      </Group>
      <Text size="sm" c="dimmed" mb="sm">
        <Text span ff="monospace">{rotation.from_kek_id}</Text> → <Text span ff="monospace">{rotation.to_kek_id}</Text>
        {" · "}started {fmtRelative(rotation.started_at)} by {rotation.requested_by}
        {rotation.finished_at && <> · finished {fmtTime(rotation.finished_at)}</>}
      </Text>
      <Text size="sm" fw={600} mb={4}>{rotation.done.toLocaleString()} of {rotation.total.toLocaleString()} re-wrapped ({pct} %)</Text>
      <Progress value={pct} size="lg" radius="sm" animated={running} aria-label="Re-wrapped, all kinds" mb="md" />
      <Stack gap={8}>
        {Object.entries(rotation.progress).map(([kind, p]) => {
          const kindPct = p.total ? Math.round((100 * p.done) / p.total) : 100;
          return (
            <div key={kind}>
              <Group justify="space-between" gap="xs">
                <Text size="sm">{KIND_TITLES[kind] ?? kind}</Text>
                <Text size="sm" c="dimmed">{p.done.toLocaleString()} / {p.total.toLocaleString()}</Text>
              </Group>
              <Progress value={kindPct} size="sm" radius="sm" aria-label={`Re-wrapped: ${KIND_TITLES[kind] ?? kind}`} />
            </div>
          );
        })}
      </Stack>
      {rotation.error && <Alert color="red" variant="light" mt="sm" title="The rotation stopped">{rotation.error}
        {" "}It resumes from where it stopped on the next scheduler pass or `keyserver rotate-kek`.</Alert>}
    </Paper>
  );
}

export function SystemPage() {
  const { can } = useAuth();
  const qc = useQueryClient();
  const status = useQuery({
    queryKey: qk.kek,
    queryFn: () => call(api.GET("/api/v1/system/kek")),
    // While a rotation runs, follow it; otherwise the page is static.
    refetchInterval: (q) => (q.state.data?.last_rotation?.state === "running" ? ROTATION_REFRESH_MS : false),
  });
  const health = useQuery({
    queryKey: qk.health,
    queryFn: () => call(api.GET("/api/v1/system/health")),
    refetchInterval: HEALTH_REFRESH_MS,
  });
  const [confirmRotate, setConfirmRotate] = useState(false);
  const [retiring, setRetiring] = useState<Kek | null>(null);
  const rotate = useMutation({
    mutationFn: () => call(api.POST("/api/v1/system/kek/rotate")),
    onSuccess: (r) => {
      setConfirmRotate(false);
      void qc.invalidateQueries({ queryKey: qk.kek });
      const pending = (r as unknown as { status?: string; detail?: string }).status === "pending";
      notifications.show(pending
        ? { color: "blue", title: "Waiting for approval", message: (r as unknown as { detail: string }).detail }
        : { color: "teal", title: "KEK rotation started", message: "Everything stored is being re-wrapped under the new KEK." });
    },
  });
  const retire = useMutation({
    mutationFn: (k: Kek) => call(api.POST("/api/v1/system/keks/{kek_id}/retire", { params: { path: { kek_id: k.kek_id } } })),
    onSuccess: (k) => {
      setRetiring(null);
      void qc.invalidateQueries({ queryKey: qk.kek });
      notifications.show({ color: "teal", title: "KEK retired", message: `${k.kek_id} was removed from the HSM token` });
    },
  });

  if (status.error) return <ErrorAlert error={status.error} />;
  if (status.isPending) return <Loading />;
  const { keks, last_rotation: rotation, hsm } = status.data;
  const running = rotation?.state === "running";
  const active = keks.find((k) => k.state === "active");

  return (
    <Stack gap="md">
      <PageHeader title="System"
        subtitle="This replica's health and the audit chain; the key-encryption keys in the HSM, which wrap every key stored in the database. Rotate to move everything under a new KEK; retire a superseded one to remove it from the token."
        actions={can("system:kek") && (
          <Button color="ink" leftSection={<IconRefresh size={16} />} onClick={() => setConfirmRotate(true)}
                  disabled={running} data-testid="rotate-kek">
            {running ? "Rotation running…" : "Rotate KEK"}
          </Button>
        )} />
      {health.error ? <ErrorAlert error={health.error} title="Health not available" />
        : health.data ? <HealthSection h={health.data} /> : <Loading label="Checking health…" />}
      <SimpleGrid cols={{ base: 1, sm: 2 }} spacing="md">
        <Paper withBorder radius="md" p="md">
          <Title order={2} size="h4" mb="xs">HSM</Title>
          <Table.ScrollContainer minWidth={0}>
            <Table fz="sm" verticalSpacing={4} withRowBorders={false}>
              <Table.Tbody>
                {([["Manufacturer", hsm.manufacturer], ["Model", hsm.model], ["Firmware", hsm.firmware],
                   ["Key wrapping", hsm.rsa_wrap_mechanism]] as const).map(([label, value]) => (
                  <Table.Tr key={label}><Table.Td c="dimmed" w={140}>{label}</Table.Td><Table.Td>{String(value ?? "—")}</Table.Td></Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        </Paper>
        <Paper withBorder radius="md" p="md">
          <Title order={2} size="h4" mb="xs">Active KEK</Title>
          {active ? (
            <Stack gap={4}>
              <Text ff="monospace" fw={600} data-testid="active-kek">{active.kek_id}</Text>
              <Text size="sm" c="dimmed">RSA-2048 in the HSM, created {fmtTime(active.created_at)}</Text>
              <Text size="sm">Wraps {wrappedTotal(active).toLocaleString()} stored items</Text>
            </Stack>
          ) : <Text size="sm" c="dimmed">None: run <Text span ff="monospace">keyserver init</Text>.</Text>}
        </Paper>
      </SimpleGrid>
      {rotation && <RotationCard rotation={rotation} />}
      <Paper withBorder radius="md">
        <Table.ScrollContainer minWidth={820}>
          <Table fz="sm" verticalSpacing={8} data-testid="kek-table">
            <Table.Thead><Table.Tr>
              <Table.Th>KEK</Table.Th><Table.Th>State</Table.Th><Table.Th>Created</Table.Th>
              <Table.Th>Superseded</Table.Th><Table.Th>Retired</Table.Th><Table.Th>Still wraps</Table.Th><Table.Th />
            </Table.Tr></Table.Thead>
            <Table.Tbody>
              {keks.map((k) => {
                const n = wrappedTotal(k);
                return (
                  <Table.Tr key={k.kek_id} data-kek={k.kek_id}>
                    <Table.Td ff="monospace">{k.kek_id}</Table.Td>
                    <Table.Td>
                      <Tooltip label={KEK_STATE[k.state].hint} withArrow>
                        <Badge color={KEK_STATE[k.state].color} variant="light" radius="sm" tabIndex={0}
                               data-state={k.state}>{k.state}</Badge>
                      </Tooltip>
                    </Table.Td>
                    <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtTime(k.created_at)}</Table.Td>
                    <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtTime(k.superseded_at)}</Table.Td>
                    <Table.Td style={{ whiteSpace: "nowrap" }}>{k.retired_at ? <>{fmtTime(k.retired_at)}<Text size="xs" c="dimmed">by {k.retired_by}</Text></> : "—"}</Table.Td>
                    <Table.Td>
                      {k.state === "retired" ? "—" : n === 0 ? <Text size="sm" c="dimmed">nothing</Text> : (
                        <Tooltip withArrow multiline w={300} label={Object.entries(k.wrapped ?? {}).filter(([, c]) => c > 0)
                          .map(([kind, c]) => `${KIND_TITLES[kind] ?? kind}: ${c.toLocaleString()}`).join(" · ")}>
                          <Text size="sm" span tabIndex={0} td="underline dotted">{n.toLocaleString()} items</Text>
                        </Tooltip>
                      )}
                    </Table.Td>
                    <Table.Td>
                      {can("system:kek") && k.state !== "retired" && k.state !== "active" && (
                        <Button size="compact-sm" variant="subtle" color="red" onClick={() => { retire.reset(); setRetiring(k); }}
                                aria-label={`Retire KEK ${k.kek_id}`}>Retire</Button>
                      )}
                    </Table.Td>
                  </Table.Tr>
                );
              })}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      </Paper>
      <Modal opened={confirmRotate} onClose={() => setConfirmRotate(false)} title="Rotate the KEK" centered>
        <Stack gap="sm">
          <Text size="sm">A new KEK is made in the HSM and becomes active at once. Everything stored under the
            current one — {active ? wrappedTotal(active).toLocaleString() : "every"} item(s) — is re-wrapped in the background;
            every key stays readable throughout. The old KEK stays in the token until you retire it.</Text>
          <ErrorAlert error={rotate.error} title="Rotation not started" />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setConfirmRotate(false)}>Cancel</Button>
            <Button color="ink" loading={rotate.isPending} onClick={() => rotate.mutate()} data-testid="rotate-kek-confirm">Rotate KEK</Button>
          </Group>
        </Stack>
      </Modal>
      <TypedConfirmDialog opened={!!retiring} onClose={() => setRetiring(null)} title={`Retire KEK ${retiring?.kek_id ?? ""}`}
        phrase={retiring?.kek_id ?? ""} actionLabel="Retire KEK" onConfirm={() => retiring && retire.mutate(retiring)}
        busy={retire.isPending} error={retire.error} blockedBy={retiring ? retireBlockedBy(retiring, rotation) : null}>
        <Text size="sm">The KEK is destroyed in the HSM token, for good. Nothing stored needs it any more; backups
          made before hold their own copy of the token (or, for a network HSM, the vendor's backup does).</Text>
      </TypedConfirmDialog>
    </Stack>
  );
}
