import {
  Alert, Anchor, Button, Code, Grid, Group, Modal, NumberInput, Paper, Select, SimpleGrid, Stack, Switch, Table, TagsInput,
  Text, TextInput, Textarea, Timeline, Title,
} from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconRotateClockwise } from "@tabler/icons-react";
import { useMutation, useQueries, useQueryClient } from "@tanstack/react-query";
import { heldDetail } from "../approvals";
import { VersionInUse, retirementApi, useKeyRetirements } from "../retirement";
import { useEffect, useState } from "react";
import { Link, useParams } from "react-router";
import { api, call, fieldError, type Key, type KeyVersion, type RevokeReason } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { CopyValue, EmptyState, Loading, OutcomeBadge, STATE_COLOR, StateBadge, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { LIMITS, lengthError, tooLong } from "../textLimits";
import { HOST_GROUP_TAG } from "../hosts";
import { qk, useKey } from "../queries";
import { useKeyConsumers } from "../databases";
import { KeyConsumersPanel } from "./KeyConsumers";
import { KeyKmipPanel } from "./KeyKmip";
import { DestroyInUse, InventoryDrawer, RetireDialog, VersionActions, retirable } from "./KeyRetirement";
import { groupError } from "../kmip";
import { KeyCryptoPanel } from "./KeyCrypto";
import { KeyUsagePanel } from "./Usage";
import { TagList, parseTags } from "./Keys";

const REASONS: { value: RevokeReason; label: string }[] = [
  { value: "key-compromise", label: "Key compromise (→ Compromised)" },
  { value: "ca-compromise", label: "CA compromise (→ Compromised)" },
  { value: "superseded", label: "Superseded" },
  { value: "cessation-of-operation", label: "Cessation of operation" },
  { value: "affiliation-changed", label: "Affiliation changed" },
  { value: "privilege-withdrawn", label: "Privilege withdrawn" },
  { value: "unspecified", label: "Unspecified" },
];

export function KeyDetailPage() {
  const { keyRef = "" } = useParams();
  const key = useKey(keyRef);
  if (key.error) return <Stack><PageHeader title={keyRef} /><ErrorAlert error={key.error} /></Stack>;
  if (key.isPending) return <Loading label="Loading key…" />;
  return <KeyView k={key.data} keyRef={keyRef} />;
}

function useKeyAction(k: Key, keyRef: string) {
  const qc = useQueryClient();
  return (label: string, fn: () => Promise<Key>) => ({
    mutationFn: fn,
    onSuccess: (updated: Key) => {
      qc.setQueryData(qk.key(keyRef), updated);
      void qc.invalidateQueries({ queryKey: qk.keysAll });
      // The audit chainer appends records a moment after the request commits.
      for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
      notifications.show({ color: "teal", title: label, message: `${k.name}: v${updated.current_version} ${updated.state}` });
    },
  });
}

function KeyView({ k, keyRef }: { k: Key; keyRef: string }) {
  const { can } = useAuth();
  const action = useKeyAction(k, keyRef);
  const path = { params: { path: { key_ref: k.id } } };
  const rotate = useMutation(action("Rotated", () => call(api.POST("/api/v1/keys/{key_ref}/rotate", path))));
  const activate = useMutation(action("Activated", () => call(api.POST("/api/v1/keys/{key_ref}/activate", path))));
  const deactivate = useMutation(action("Deactivated", () => call(api.POST("/api/v1/keys/{key_ref}/deactivate", path))));
  const [dialog, setDialog] = useState<null | "edit" | "schedule" | "revoke" | "destroy" | "deactivate">(null);
  // The older version whose inventory (drawer) or retirement (dialog) is open.
  const [inventoryOf, setInventoryOf] = useState<number | null>(null);
  const [retireOf, setRetireOf] = useState<number | null>(null);
  const retirements = useKeyRetirements(k.id);
  const destroyed = k.state === "destroyed" || k.state === "destroyed-compromised";
  const live = k.state === "active" || k.state === "pre-active";
  const actionError = rotate.error ?? activate.error;

  return (
    <Stack gap="md">
      <Text size="sm"><Anchor component={Link} to="/keys" underline="always">Keys</Anchor> / {k.name}</Text>
      <PageHeader
        title={<Group gap="sm"><span data-testid="key-name">{k.name}</span><StateBadge state={k.state} /></Group>}
        subtitle={k.description || "No description"}
        actions={<>
          {k.state === "pre-active" && (
            <GuardedButton perm="keys:activate" mode="hide" variant="default" loading={activate.isPending}
                           onClick={() => activate.mutate()}>Activate</GuardedButton>
          )}
          <GuardedButton perm="keys:rotate" color="ink" leftSection={<IconRotateClockwise size={16} />}
                         loading={rotate.isPending} disabled={destroyed} onClick={() => rotate.mutate()}
                         data-testid="rotate-key">Rotate now</GuardedButton>
          <GuardedButton perm="keys:update" variant="default" onClick={() => setDialog("edit")}
                         data-testid="edit-key">Edit details</GuardedButton>
          {/* A destroyed key is never rotated again: nothing to schedule (the server refuses too). */}
          <GuardedButton perm="keys:update" variant="default" onClick={() => setDialog("schedule")}
                         disabled={destroyed} data-testid="edit-schedule">Rotation schedule</GuardedButton>
          {can("keys:revoke") && live && (
            <Button variant="default" color="orange" onClick={() => setDialog("deactivate")}>Deactivate</Button>
          )}
          <GuardedButton perm="keys:revoke" mode="hide" variant="outline" color="orange" disabled={destroyed}
                         onClick={() => setDialog("revoke")} data-testid="revoke-key">Revoke</GuardedButton>
          <GuardedButton perm="keys:destroy" mode="hide" variant="outline" color="red" disabled={destroyed}
                         onClick={() => setDialog("destroy")} data-testid="destroy-key">Destroy</GuardedButton>
        </>}
      />
      <ErrorAlert error={actionError} />
      <Grid gutter="md">
        <Grid.Col span={{ base: 12, lg: 5 }}>
          <Paper withBorder radius="md" p="md">
            <Title order={2} size="h5" mb="sm">Properties</Title>
            <SimpleGrid cols={2} spacing={6} verticalSpacing={6} style={{ gridTemplateColumns: "120px minmax(0, 1fr)" }}>
              <Prop label="Key ID"><Group gap={2} wrap="nowrap"><Code fz="xs" style={{ wordBreak: "break-all" }}>{k.id}</Code><CopyValue value={k.id} label="Copy key ID" /></Group></Prop>
              <Prop label="Algorithm">{k.algorithm}-{k.length_bits}</Prop>
              <Prop label="Current version">v{k.current_version}</Prop>
              <Prop label="Owner">{k.owner || "—"}</Prop>
              <Prop label="KMIP group">{k.kmip_group ? <Text span size="sm" ff="monospace">{k.kmip_group}</Text> : "—"}</Prop>
              <Prop label="Rotation">{k.rotation_period_days ? `every ${k.rotation_period_days} days` : "manual only"}</Prop>
              <Prop label="Next rotation">{k.next_rotation_at ? `${fmtTime(k.next_rotation_at)} (${fmtRelative(k.next_rotation_at)})` : "—"}</Prop>
              <Prop label="Created">{fmtTime(k.created_at)}</Prop>
              <Prop label="Updated">{fmtTime(k.updated_at)}</Prop>
              <Prop label="Tags"><TagList tags={k.tags} /></Prop>
              {k.tags[HOST_GROUP_TAG] && can("hosts:read") && (
                <Prop label="Delivered to">
                  <Anchor component={Link} to={`/hosts?group=${encodeURIComponent(k.tags[HOST_GROUP_TAG])}`} size="sm"
                          data-testid="key-hosts">hosts of group {k.tags[HOST_GROUP_TAG]}</Anchor>
                </Prop>
              )}
            </SimpleGrid>
          </Paper>
        </Grid.Col>
        <Grid.Col span={{ base: 12, lg: 7 }}>
          <Paper withBorder radius="md" p="md">
            <Title order={2} size="h5" mb="sm">Versions</Title>
            <VersionTimeline k={k} actions={(v) => retirable(k, v) && (
              <VersionActions v={v} retirement={retirements.data?.[v.version]}
                              onInventory={() => setInventoryOf(v.version)} onRetire={() => setRetireOf(v.version)} />
            )} />
          </Paper>
        </Grid.Col>
      </Grid>
      <KeyConsumersPanel k={k} />
      <KeyKmipPanel k={k} onEdit={() => setDialog("edit")} />
      <KeyCryptoPanel k={k} />
      {can("audit:read") && <KeyUsagePanel keyId={k.id} />}
      {can("audit:read") && <KeyUsage k={k} />}
      <EditDialog k={k} keyRef={keyRef} opened={dialog === "edit"} onClose={() => setDialog(null)} />
      <ScheduleDialog k={k} keyRef={keyRef} opened={dialog === "schedule"} onClose={() => setDialog(null)} />
      <RevokeDialog k={k} keyRef={keyRef} opened={dialog === "revoke"} onClose={() => setDialog(null)} />
      <DestroyDialog k={k} keyRef={keyRef} opened={dialog === "destroy"} onClose={() => setDialog(null)}
                     onInventory={(v) => { setDialog(null); setInventoryOf(v); }} onRetire={(v) => { setDialog(null); setRetireOf(v); }} />
      <InventoryDrawer k={k} version={inventoryOf} onClose={() => setInventoryOf(null)}
                       onRetire={(v) => { setInventoryOf(null); setRetireOf(v); }} />
      <RetireDialog k={k} version={retireOf} onClose={() => setRetireOf(null)} onStarted={(v) => setInventoryOf(v)} />
      <TypedConfirmDialog opened={dialog === "deactivate"} onClose={() => setDialog(null)} title={`Deactivate ${k.name}`}
                          phrase={k.name} actionLabel="Deactivate" busy={deactivate.isPending} error={deactivate.error}
                          onConfirm={() => deactivate.mutate(undefined, { onSuccess: () => setDialog(null) })}>
        <Text size="sm">The active version stops encrypting new data. Existing data still decrypts.
          Rotate to get a new active version.</Text>
      </TypedConfirmDialog>
    </Stack>
  );
}

function Prop({ label, children }: { label: string; children: React.ReactNode }) {
  return <><Text size="sm" c="dimmed">{label}</Text><Text size="sm" component="div" style={{ overflowWrap: "anywhere" }}>{children}</Text></>;
}

/** `actions`: what the page offers for one version (the inventory and retirement of an older one). */
export function VersionTimeline({ k, actions }: { k: Key; actions?: (v: KeyVersion) => React.ReactNode }) {
  const versions = [...k.versions].sort((a, b) => b.version - a.version);
  const activeIdx = versions.findIndex((v) => v.state === "active");
  return (
    <Timeline active={activeIdx} bulletSize={18} lineWidth={2} data-testid="version-timeline">
      {versions.map((v) => (
        <Timeline.Item key={v.version} color={STATE_COLOR[v.state]}
                       title={<Group gap="xs"><Text fw={600} size="sm">v{v.version}</Text><StateBadge state={v.state} /></Group>}>
          <Text size="xs" c="dimmed">created {fmtTime(v.created_at)}
            {v.activation_date && <> · activated {fmtTime(v.activation_date)}</>}
            {v.deactivation_date && <> · deactivated {fmtTime(v.deactivation_date)}</>}
            {v.compromise_date && <> · compromised {fmtTime(v.compromise_date)}</>}
            {v.destroy_date && <> · destroyed {fmtTime(v.destroy_date)}</>}
          </Text>
          {v.revocation_reason && (
            <Text size="xs" c="var(--sr-text-warning)">revoked: {v.revocation_reason}{v.revocation_message ? ` — ${v.revocation_message}` : ""}</Text>
          )}
          {v.wrapping_mechanism && (
            <Text size="xs" c="dimmed">wrapped by {v.wrapping_key_id} ({v.wrapping_mechanism})</Text>
          )}
          {actions?.(v)}
        </Timeline.Item>
      ))}
    </Timeline>
  );
}

function KeyUsage({ k }: { k: Key }) {
  // Records name the key by id once it is resolved; refusals name it as the caller did
  // (often by name): ask for both and merge.
  const refs = Array.from(new Set([k.id, k.name]));
  const results = useQueries({
    queries: refs.map((ref) => ({
      queryKey: ["audit", "list", { object_id: ref, limit: 50 }],
      queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: { object_id: ref, limit: 50 } } })),
    })),
  });
  const error = results.find((r) => r.error)?.error;
  const events = results.flatMap((r) => r.data?.items ?? [])
    .filter((e, i, all) => all.findIndex((x) => x.seq === e.seq) === i)
    .sort((a, b) => b.seq - a.seq).slice(0, 50);
  return (
    <Paper withBorder radius="md" p="md">
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h5">Recent records</Title>
        <Anchor component={Link} to={`/audit?object_id=${encodeURIComponent(k.id)}`} size="sm">Open in audit log</Anchor>
      </Group>
      {error ? <ErrorAlert error={error} /> : results.some((r) => r.isPending) ? <Loading /> : events.length === 0 ? (
        <EmptyState title="No recorded use">Key operations and refusals on this key will appear here.</EmptyState>
      ) : (
        <Table.ScrollContainer minWidth={560}>
          <Table fz="sm" verticalSpacing={6} data-testid="key-usage">
            <Table.Thead><Table.Tr><Table.Th>#</Table.Th><Table.Th>Time</Table.Th><Table.Th>Actor</Table.Th>
              <Table.Th>Action</Table.Th><Table.Th>Outcome</Table.Th><Table.Th>Source</Table.Th></Table.Tr></Table.Thead>
            <Table.Tbody>
              {events.map((e) => (
                <Table.Tr key={e.seq}>
                  <Table.Td><Anchor component={Link} to={`/audit?seq=${e.seq}`} size="sm">{e.seq}</Anchor></Table.Td>
                  <Table.Td>{fmtTime(e.time)}</Table.Td>
                  <Table.Td>{e.actor} <Text span size="xs" c="dimmed">({e.actor_type})</Text></Table.Td>
                  <Table.Td><Text size="sm" ff="monospace">{e.action}</Text></Table.Td>
                  <Table.Td><OutcomeBadge outcome={e.outcome} /></Table.Td>
                  <Table.Td>{e.source_ip ?? "—"}</Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Paper>
  );
}

const tagEntries = (tags: Record<string, string>) => Object.entries(tags).map(([n, v]) => (v ? `${n}=${v}` : n));

/** The changes between two tag maps, as a person reads them. */
export function tagChanges(before: Record<string, string>, after: Record<string, string>): string[] {
  const out: string[] = [];
  for (const [n, v] of Object.entries(after)) {
    if (!(n in before)) out.push(`adds ${n}${v ? `=${v}` : ""}`);
    else if (before[n] !== v) out.push(`changes ${n} from ${before[n] || "(empty)"} to ${v || "(empty)"}`);
  }
  for (const n of Object.keys(before)) if (!(n in after)) out.push(`removes ${n}`);
  return out;
}

/** Description, owner and tags; only what changed is sent. The host-group tag decides
 *  which hosts receive the key, so changing it says what it does to hosts. */
function EditDialog({ k, keyRef, opened, onClose }: { k: Key; keyRef: string; opened: boolean; onClose: () => void }) {
  const [description, setDescription] = useState(k.description);
  const [owner, setOwner] = useState(k.owner);
  const [kmipGroup, setKmipGroup] = useState(k.kmip_group ?? "");
  const [tags, setTags] = useState<string[]>(tagEntries(k.tags));
  const action = useKeyAction(k, keyRef);
  const parsed = parseTags(tags);
  const changes = tagChanges(k.tags, parsed);
  const body: { description?: string; owner?: string; tags?: Record<string, string>; kmip_group?: string | null } = {};
  if (description !== k.description) body.description = description;
  if (owner.trim() !== k.owner) body.owner = owner.trim();
  // Empty clears it (null): then no KMIP client sees the key except through a grant.
  if ((kmipGroup.trim() || null) !== (k.kmip_group ?? null)) body.kmip_group = kmipGroup.trim() || null;
  if (changes.length) body.tags = parsed;
  const save = useMutation(action("Details saved", () => call(api.PATCH("/api/v1/keys/{key_ref}", {
    params: { path: { key_ref: k.id } }, body }))));
  // Each opening starts from the key as it is now (it may have changed since the last one).
  useEffect(() => {
    if (opened) { setDescription(k.description); setOwner(k.owner); setKmipGroup(k.kmip_group ?? ""); setTags(tagEntries(k.tags)); save.reset(); }
    // On opening only: while the dialog is open a refetched key must not overwrite what is being typed.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [opened]);
  const close = () => onClose();
  const groupBefore = k.tags[HOST_GROUP_TAG], groupAfter = parsed[HOST_GROUP_TAG];
  const descriptionError = lengthError(description, LIMITS.keyDescription, save.error, "description");
  const ownerError = lengthError(owner.trim(), LIMITS.keyOwner, save.error, "owner");
  const kmipGroupError = groupError(kmipGroup) ?? fieldError(save.error, "kmip_group");
  const tooLongNow = !!tooLong(description, LIMITS.keyDescription) || !!tooLong(owner.trim(), LIMITS.keyOwner) || !!groupError(kmipGroup);
  const badTag = Object.keys(parsed).find((n) => n.length < 1 || n.length > 64) ?? Object.entries(parsed).find(([, v]) => v.length > 256)?.[0];
  return (
    <Modal opened={opened} onClose={close} title={`Edit ${k.name}`} centered size="lg">
      <form aria-label="Edit key details" onSubmit={(e) => {
        e.preventDefault();
        if (Object.keys(body).length && !tooLongNow && badTag === undefined) save.mutate(undefined, { onSuccess: close });
      }}>
        <Stack gap="sm">
          <Textarea label="Description" value={description} error={descriptionError} autosize minRows={2} maxRows={12}
                    onChange={(e) => setDescription(e.currentTarget.value)} data-autofocus />
          <TextInput label="Owner" description="The person or team answerable for this key" value={owner} error={ownerError}
                     onChange={(e) => setOwner(e.currentTarget.value)} />
          <TextInput label="KMIP group" value={kmipGroup} error={kmipGroupError} onChange={(e) => setKmipGroup(e.currentTarget.value)}
                     description="KMIP clients of this group see and use the key; empty: none does, except through a grant" />
          {"kmip_group" in body && (
            <Alert color="orange" variant="light" data-testid="kmip-group-change">
              {k.kmip_group && <>KMIP clients of group <b>{k.kmip_group}</b> no longer see this key from their next request,
                unless a grant gives it to them. </>}
              {body.kmip_group ? <>Clients of group <b>{body.kmip_group}</b> see it from their next request.</>
                : <>No KMIP client sees it except through a grant.</>}
            </Alert>
          )}
          <TagsInput label="Tags" description="name=value, press Enter after each; at most 50" value={tags} onChange={setTags}
                     error={badTag !== undefined ? `Tag ${badTag || "(empty)"}: names are 1-64 characters, values at most 256` : undefined} />
          {changes.length > 0 && <Text size="sm" data-testid="tag-changes">This {changes.join(", ")}.</Text>}
          {groupBefore !== groupAfter && (
            <Alert color="orange" variant="light" data-testid="host-group-change">
              {groupBefore && <>Hosts of group <b>{groupBefore}</b> stop receiving this key through their group at their
                next fetch (unless a guard point of theirs uses it): what they encrypted with it becomes unreadable to them. </>}
              {groupAfter && <>Hosts of group <b>{groupAfter}</b> receive it from their next heartbeat.</>}
            </Alert>
          )}
          <ErrorAlert error={save.error} title="Not saved" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={save.isPending} disabled={!Object.keys(body).length || badTag !== undefined || tooLongNow}
                    data-testid="save-key-details">Save</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function ScheduleDialog({ k, keyRef, opened, onClose }: { k: Key; keyRef: string; opened: boolean; onClose: () => void }) {
  const [enabled, setEnabled] = useState(!!k.rotation_period_days);
  const [days, setDays] = useState<number | string>(k.rotation_period_days ?? 90);
  const action = useKeyAction(k, keyRef);
  const save = useMutation(action("Rotation schedule saved", () => call(api.PATCH("/api/v1/keys/{key_ref}", {
    params: { path: { key_ref: k.id } },
    body: enabled ? { rotation_period_days: Number(days) } : { rotation_period_days: null, clear_rotation: true },
  }))));
  return (
    <Modal opened={opened} onClose={onClose} title="Rotation schedule" centered>
      <form onSubmit={(e) => { e.preventDefault(); save.mutate(undefined, { onSuccess: onClose }); }}>
        <Stack gap="sm">
          <Switch label="Rotate automatically" checked={enabled} onChange={(e) => setEnabled(e.currentTarget.checked)} />
          <NumberInput label="Rotation period (days)" min={1} max={3650} allowDecimal={false} disabled={!enabled}
                       value={days} onChange={setDays} />
          <Text size="xs" c="dimmed">The scheduler makes a new active version when the period has passed.</Text>
          <ErrorAlert error={save.error} />
          <Group justify="flex-end">
            <Button variant="default" onClick={onClose}>Cancel</Button>
            <Button type="submit" color="ink" loading={save.isPending}>Save</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function RevokeDialog({ k, keyRef, opened, onClose }: { k: Key; keyRef: string; opened: boolean; onClose: () => void }) {
  const [reason, setReason] = useState<RevokeReason>("superseded");
  const [message, setMessage] = useState("");
  const action = useKeyAction(k, keyRef);
  const revoke = useMutation(action("Revoked", () => call(api.POST("/api/v1/keys/{key_ref}/revoke", {
    params: { path: { key_ref: k.id } }, body: { reason, message },
  }))));
  const compromise = reason === "key-compromise" || reason === "ca-compromise";
  const messageError = lengthError(message, LIMITS.revokeMessage, revoke.error, "message");
  // A running MariaDB that writes under this key aborts at its next write once it cannot read
  // the key, and cannot finish crash recovery until the key is back (docs/integrations.md).
  const consumers = useKeyConsumers(k.id, opened);
  // One name per database: a database that reads the key under several key ids has a grant for each.
  const databases = [...new Set((consumers.data?.items ?? []).filter((c) => c.kind === "database").map((c) => c.name))];
  return (
    <TypedConfirmDialog opened={opened} onClose={onClose} title={`Revoke ${k.name}`} phrase={k.name}
                        actionLabel="Revoke key" busy={revoke.isPending} error={revoke.error}
                        invalid={!!tooLong(message, LIMITS.revokeMessage)}
                        onConfirm={() => revoke.mutate(undefined, { onSuccess: onClose })}>
      <Select label="Reason" data={REASONS} value={reason} allowDeselect={false}
              onChange={(v) => v && setReason(v as RevokeReason)} comboboxProps={{ withinPortal: true }} />
      <Textarea label="Message" description="Kept with each revoked version and shown on this page; the audit log records the reason, not this message"
                value={message} onChange={(e) => setMessage(e.currentTarget.value)} error={messageError} autosize minRows={2} maxRows={12} />
      <Text size="sm" c={compromise ? "var(--sr-text-danger)" : undefined}>
        {compromise
          ? "Compromised versions can no longer decrypt anything. Data protected by them must be restored from other copies."
          : "The active version is deactivated: it still decrypts, but encrypts nothing new."}
      </Text>
      {databases.length > 0 && (
        <Alert color="red" variant="light" title={`${databases.length === 1 ? "A database reads" : `${databases.length} databases read`} this key`}
               data-testid="revoke-databases-warning">
          <Text size="sm">
            {databases.join(", ")}: MariaDB stops reading the key once it is revoked. A server
            that is running aborts at its next write under it and cannot recover until the key is back. Shut
            {databases.length === 1 ? " that database" : " those databases"} down cleanly first (or move their
            tables to another key), then revoke.
          </Text>
        </Alert>
      )}
    </TypedConfirmDialog>
  );
}

const firstTarget = (left: KeyVersion[]) => {
  const older = left.find((v) => v.state !== "active");
  return left.some((v) => v.state === "active") && older ? String(older.version) : "all";
};

/** Destroys one version or every version. A version something still uses is refused
 *  (version_in_use, with its holders): the way forward is retiring it first, or shredding
 *  on purpose after typing the key's name again. */
export function DestroyDialog({ k, keyRef, opened, onClose, onInventory, onRetire }: {
  k: Key; keyRef: string; opened: boolean; onClose: () => void;
  onInventory: (version: number) => void; onRetire: (version: number) => void;
}) {
  const qc = useQueryClient();
  const left = k.versions.filter((v) => v.state !== "destroyed" && v.state !== "destroyed-compromised")
    .sort((a, b) => a.version - b.version);
  const [target, setTarget] = useState<string>(() => firstTarget(left));
  const [shred, setShred] = useState(false);
  const version = target === "all" ? undefined : Number(target);
  const destroy = useMutation({
    mutationFn: (withShred: boolean) => retirementApi.destroy(k.id, { ...(version != null && { version }), ...(withShred && { shred: true }) }),
    onSuccess: (r) => {
      void qc.invalidateQueries({ queryKey: qk.keysAll });
      for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
      const waiting = heldDetail(r);
      if (waiting) {
        notifications.show({ color: "blue", title: "Waiting for approval", message: waiting });
      } else {
        qc.setQueryData(qk.key(keyRef), r);
        notifications.show({ color: "teal", title: shred ? "Shredded" : "Destroyed",
                             message: `${k.name}: ${version != null ? `v${version}` : "every version"} destroyed` });
      }
      close();
    },
  });
  // Each opening starts over, on what the server would destroy: the whole key, or, while a
  // version is active, the oldest older one.
  useEffect(() => {
    if (opened) { setTarget(firstTarget(left)); setShred(false); destroy.reset(); }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [opened]);
  const close = () => onClose();
  const targets = version != null ? left.filter((v) => v.version === version) : left;
  const hasActive = targets.some((v) => v.state === "active");
  const inUse = destroy.error instanceof VersionInUse ? destroy.error : null;
  const label = version != null ? `v${version}` : "every version";
  return (
    <TypedConfirmDialog opened={opened} onClose={close} title={`Destroy ${k.name}`} phrase={k.name} resetKey={shred ? "shred" : "destroy"}
                        actionLabel={shred ? `Shred ${label} anyway` : version != null ? `Destroy v${version}` : "Destroy every version"}
                        busy={destroy.isPending} error={inUse && !shred ? null : destroy.error}
                        blockedBy={hasActive ? `${version != null ? `v${version} is` : "The key has"} an active version: deactivate or revoke it, `
                                   + "or rotate and destroy an older version (the server refuses to destroy an active version)." : null}
                        onConfirm={() => destroy.mutate(shred)}>
      <Text size="sm" fw={600} c="var(--sr-text-danger)">This cannot be undone.</Text>
      {left.length > 1 && (
        <Select label="Version" data={[{ value: "all", label: `Every version (${left.length})` },
                                       ...left.map((v) => ({ value: String(v.version), label: `v${v.version} (${v.state})` }))]}
                value={target} allowDeselect={false} comboboxProps={{ withinPortal: true }} data-testid="destroy-version"
                onChange={(t) => { if (t) { setTarget(t); setShred(false); destroy.reset(); } }} />
      )}
      <Text size="sm">The key material of {version != null ? `v${version}` : `all ${left.length} version(s)`} is erased. Anything
        still encrypted under it becomes unreadable. The key's metadata and audit trail are kept. A version something still
        uses is refused: retire it first.</Text>
      {inUse && (
        <DestroyInUse k={k} error={inUse} version={version} shred={shred}
                      onInventory={onInventory} onRetire={onRetire} onShred={() => setShred(true)} />
      )}
    </TypedConfirmDialog>
  );
}
