import {
  Alert, Anchor, Autocomplete, Button, Checkbox, Group, List, Modal, NumberInput, Pagination, Paper, Progress, Select, Stack, Switch,
  Table, TagsInput, Text, TextInput, Textarea,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { notifications } from "@mantine/notifications";
import { IconPlus, IconSearch } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { Link, useNavigate, useSearchParams } from "react-router";
import { ApiError, KEY_STATES, api, call, fieldError, type Key, type KeyState, type RevokeReason } from "../api/client";
import { useAuth } from "../auth";
import { GuardedButton } from "../components/Guarded";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, StateBadge, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { qk, useKeys, type KeySort } from "../queries";
import { groupError, useKmipGroups } from "../kmip";
import { SortHeader } from "../components/SortHeader";
import { LIMITS, lengthError, tooLong } from "../textLimits";

const PAGE = 25;

export function KeysPage() {
  const [params, setParams] = useSearchParams();
  const [q, setQ] = useState(params.get("q") ?? "");
  const [debouncedQ] = useDebouncedValue(q, 250);
  const state = (params.get("state") as KeyState | null) ?? undefined;
  const tag = params.get("tag") ?? "";
  const [tagInput, setTagInput] = useState(tag);
  const page = Number(params.get("page") ?? "1") || 1;
  const [creating, setCreating] = useState(false);
  // The URL is the source of truth (links, back button): follow it when it changes.
  const urlQ = params.get("q") ?? "";
  useEffect(() => { setQ(urlQ); }, [urlQ]);
  useEffect(() => { setTagInput(tag); }, [tag]);
  const sort = (params.get("sort") as KeySort | null) ?? "name";
  const keys = useKeys({ q: debouncedQ, state, tag, limit: PAGE, offset: (page - 1) * PAGE, sort });
  const { can } = useAuth();
  const bulk = can("keys:rotate") || can("keys:revoke");
  const [selected, setSelected] = useState<Map<string, Key>>(new Map());
  const [bulkAction, setBulkAction] = useState<BulkAction | null>(null);
  const toggle = (k: Key) => setSelected((prev) => {
    const next = new Map(prev);
    if (next.has(k.id)) next.delete(k.id); else next.set(k.id, k);
    return next;
  });
  const shown = keys.data?.items ?? [];
  const allShown = shown.length > 0 && shown.every((k) => selected.has(k.id));

  const update = (changes: Record<string, string | undefined>) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) { if (v) next.set(k, v); else next.delete(k); }
    if (!("page" in changes)) next.delete("page");
    setParams(next, { replace: true });
  };
  const filtered = !!(debouncedQ || state || tag);
  const sortBy = (column: string) => update({ sort: sort === column ? `-${column}` : column === "name" ? undefined : column,
                                              page: undefined });
  const pages = keys.data ? Math.max(1, Math.ceil(keys.data.total / PAGE)) : 1;

  return (
    <Stack gap="md">
      <PageHeader title="Keys" subtitle="Managed AES-256 keys, wrapped under the HSM's key-encryption key"
                  actions={<GuardedButton perm="keys:create" mode="hide" leftSection={<IconPlus size={16} />}
                                          color="ink" onClick={() => setCreating(true)} data-testid="create-key">
                    Create key</GuardedButton>} />
      <Paper withBorder radius="md" p="sm">
        <Group gap="sm" align="flex-end">
          <TextInput label="Search" placeholder="Name or description" leftSection={<IconSearch size={14} />}
                     value={q} onChange={(e) => { setQ(e.currentTarget.value); update({ q: e.currentTarget.value || undefined }); }}
                     w={260} />
          <Select label="State" placeholder="Any state" clearable data={KEY_STATES} value={state ?? null}
                  onChange={(v) => update({ state: v ?? undefined })} w={200} />
          <form onSubmit={(e) => { e.preventDefault(); update({ tag: tagInput.trim() || undefined }); }}>
            <TextInput label="Tag" placeholder="env or env=prod" value={tagInput}
                       onChange={(e) => setTagInput(e.currentTarget.value)}
                       onBlur={() => update({ tag: tagInput.trim() || undefined })} w={200} />
          </form>
          {filtered && <Button variant="subtle" color="gray" onClick={() => { setQ(""); setTagInput(""); setParams({}, { replace: true }); }}>
            Clear filters</Button>}
        </Group>
      </Paper>
      {selected.size > 0 && (
        <Paper withBorder radius="md" p="xs" data-testid="bulk-bar">
          <Group gap="sm">
            <Text size="sm" fw={600}>{selected.size} key{selected.size === 1 ? "" : "s"} selected</Text>
            {can("keys:rotate") && <Button size="xs" color="ink" onClick={() => setBulkAction("rotate")} data-testid="bulk-rotate">Rotate…</Button>}
            {can("keys:revoke") && <Button size="xs" variant="outline" color="orange" onClick={() => setBulkAction("revoke")}
                                            data-testid="bulk-revoke">Revoke…</Button>}
            <Button size="xs" variant="subtle" color="gray" onClick={() => setSelected(new Map())}>Clear selection</Button>
          </Group>
        </Paper>
      )}
      <Paper withBorder radius="md">
        {keys.error ? <ErrorAlert error={keys.error} /> : keys.isPending ? <Loading label="Loading keys…" /> :
          keys.data.items.length === 0 ? (
            filtered ? <EmptyState title="No key matches these filters">Change or clear the filters.</EmptyState>
              : <EmptyState title="No keys yet">Create a key to start: it gets an Active version wrapped by the HSM.</EmptyState>
          ) : (
            <Table.ScrollContainer minWidth={800}>
              <Table highlightOnHover fz="sm" verticalSpacing={8} data-testid="keys-table">
                <Table.Thead>
                  <Table.Tr>
                    {bulk && <Table.Th w={36}>
                      <Checkbox aria-label="Select every key on this page" checked={allShown}
                                indeterminate={!allShown && shown.some((k) => selected.has(k.id))}
                                onChange={() => setSelected((prev) => {
                                  const next = new Map(prev);
                                  for (const k of shown) { if (allShown) next.delete(k.id); else next.set(k.id, k); }
                                  return next;
                                })} />
                    </Table.Th>}
                    <SortHeader label="Name" column="name" sort={sort} onSort={sortBy} />
                    <Table.Th>State</Table.Th><Table.Th>Version</Table.Th>
                    <SortHeader label="Rotation" column="next_rotation_at" sort={sort} onSort={sortBy} />
                    <Table.Th>Tags</Table.Th>
                    <SortHeader label="Updated" column="updated_at" sort={sort} onSort={sortBy} />
                  </Table.Tr>
                </Table.Thead>
                <Table.Tbody>
                  {keys.data.items.map((k) => (
                    <Table.Tr key={k.id} data-key={k.name}>
                      {bulk && <Table.Td>
                        <Checkbox aria-label={`Select ${k.name}`} checked={selected.has(k.id)} onChange={() => toggle(k)} />
                      </Table.Td>}
                      <Table.Td>
                        <Anchor component={Link} to={`/keys/${encodeURIComponent(k.name)}`} fw={600} size="sm">{k.name}</Anchor>
                        {k.description && <Text size="xs" c="dimmed" lineClamp={1}>{k.description}</Text>}
                      </Table.Td>
                      <Table.Td><StateBadge state={k.state} /></Table.Td>
                      <Table.Td>v{k.current_version}</Table.Td>
                      <Table.Td>{k.rotation_period_days
                        ? <Text size="sm" title={fmtTime(k.next_rotation_at)}>every {k.rotation_period_days} d · next {fmtRelative(k.next_rotation_at)}</Text>
                        : <Text size="sm" c="dimmed">manual</Text>}</Table.Td>
                      <Table.Td><TagList tags={k.tags} /></Table.Td>
                      <Table.Td title={fmtTime(k.updated_at)}>{fmtRelative(k.updated_at)}</Table.Td>
                    </Table.Tr>
                  ))}
                </Table.Tbody>
              </Table>
            </Table.ScrollContainer>
          )}
      </Paper>
      {keys.data && keys.data.total > 0 && (
        <Group justify="space-between">
          <Text size="sm" c="dimmed">
            {keys.data.offset + 1}–{keys.data.offset + keys.data.items.length} of {keys.data.total}
          </Text>
          <Pagination total={pages} value={page} onChange={(p) => update({ page: String(p) })} size="sm"
                      aria-label="Pages of keys"
                      getItemProps={(p) => ({ "aria-label": `Page ${p}` })}
                      getControlProps={(c) => ({ "aria-label": { first: "First page", previous: "Previous page",
                                                                  next: "Next page", last: "Last page" }[c] })} />
        </Group>
      )}
      <CreateKeyDialog opened={creating} onClose={() => setCreating(false)} />
      <BulkDialog action={bulkAction} keys={[...selected.values()]} onClose={(done) => {
        setBulkAction(null);
        if (done) setSelected(new Map());
      }} />
    </Stack>
  );
}

type BulkAction = "rotate" | "revoke";
interface BulkResult { key: Key; error?: string }

/** Rotate or revoke the selected keys with one typed confirmation, one request per key
 *  (each authorised and audited on its own), showing progress and what failed. */
export function BulkDialog({ action, keys, onClose }: { action: BulkAction | null; keys: Key[]; onClose: (done: boolean) => void }) {
  const qc = useQueryClient();
  const [typed, setTyped] = useState("");
  const [reason, setReason] = useState<RevokeReason>("superseded");
  const [results, setResults] = useState<BulkResult[] | null>(null);
  const [running, setRunning] = useState(false);
  const phrase = `${action} ${keys.length} key${keys.length === 1 ? "" : "s"}`;
  const close = () => { const done = results !== null; setTyped(""); setResults(null); setRunning(false); onClose(done); };
  const run = async () => {
    setRunning(true);
    const out: BulkResult[] = [];
    setResults(out);
    for (const k of keys) {
      const path = { params: { path: { key_ref: k.id } } };
      try {
        if (action === "rotate") await call(api.POST("/api/v1/keys/{key_ref}/rotate", path));
        else await call(api.POST("/api/v1/keys/{key_ref}/revoke", { ...path, body: { reason } }));
        out.push({ key: k });
      } catch (e) {
        out.push({ key: k, error: e instanceof ApiError ? e.detail : String(e) });
      }
      setResults([...out]);
    }
    setRunning(false);
    void qc.invalidateQueries({ queryKey: qk.keysAll });
    const failed = out.filter((r) => r.error).length;
    notifications.show({ color: failed ? "orange" : "teal", title: `${action === "rotate" ? "Rotated" : "Revoked"} ${out.length - failed} of ${out.length}`,
                         message: failed ? `${failed} refused: see the list` : "Each is in the audit log" });
  };
  const failed = results?.filter((r) => r.error) ?? [];
  return (
    <Modal opened={action !== null} onClose={running ? () => undefined : close} title={`${action === "rotate" ? "Rotate" : "Revoke"} ${keys.length} keys`}
           centered size="lg" closeOnClickOutside={!running} withCloseButton={!running}>
      <Stack gap="sm" data-testid="bulk-dialog">
        {results === null ? (
          <form onSubmit={(e) => { e.preventDefault(); if (typed === phrase) void run(); }}>
            <Stack gap="sm">
              <Text size="sm">{action === "rotate"
                ? "Each key gets a new active version; data encrypted under older versions still decrypts."
                : "Each key's current version stops encrypting and is marked revoked; with a compromise reason it becomes Compromised."}</Text>
              <List size="sm" spacing={2} style={{ maxHeight: 160, overflowY: "auto" }} tabIndex={0} aria-label="The selected keys">
                {keys.map((k) => <List.Item key={k.id}><Text span ff="monospace" size="sm">{k.name}</Text></List.Item>)}
              </List>
              {action === "revoke" && (
                <Select label="Reason" data={["superseded", "cessation-of-operation", "key-compromise", "affiliation-changed",
                                              "privilege-withdrawn", "unspecified"]} allowDeselect={false}
                        value={reason} onChange={(v) => setReason((v ?? "superseded") as RevokeReason)} />
              )}
              <TextInput label={<>Type <Text span ff="monospace" fw={700}>{phrase}</Text> to confirm</>} value={typed}
                         onChange={(e) => setTyped(e.currentTarget.value)} autoComplete="off" data-autofocus
                         data-testid="bulk-confirm-input" />
              <Group justify="flex-end">
                <Button variant="default" onClick={close}>Cancel</Button>
                <Button type="submit" color={action === "rotate" ? "ink" : "red"} disabled={typed !== phrase}
                        data-testid="bulk-confirm-submit">{action === "rotate" ? "Rotate" : "Revoke"} {keys.length} keys</Button>
              </Group>
            </Stack>
          </form>
        ) : (
          <>
            <Text size="sm" fw={600}>{results.length} of {keys.length} done</Text>
            <Progress value={(100 * results.length) / Math.max(keys.length, 1)} animated={running} aria-label="Done" />
            {failed.length > 0 && (
              <Alert color="orange" variant="light" title={`${failed.length} refused`} data-testid="bulk-failures">
                <List size="sm">{failed.map((r) => <List.Item key={r.key.id}><b>{r.key.name}</b>: {r.error}</List.Item>)}</List>
              </Alert>
            )}
            <Group justify="flex-end"><Button color="ink" onClick={close} disabled={running} data-testid="bulk-done">Done</Button></Group>
          </>
        )}
      </Stack>
    </Modal>
  );
}

export function TagList({ tags }: { tags: Record<string, string> }) {
  const entries = Object.entries(tags);
  if (!entries.length) return <Text size="sm" c="dimmed">—</Text>;
  return (
    <Group gap={4}>
      {entries.map(([k, v]) => (
        <Text key={k} size="xs" ff="monospace" px={6} py={1} bg="var(--sr-tag-bg)" style={{ borderRadius: 3 }}>
          {v ? `${k}=${v}` : k}
        </Text>
      ))}
    </Group>
  );
}

export function parseTags(entries: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of entries) {
    const i = e.indexOf("=");
    if (i < 0) out[e.trim()] = "";
    else out[e.slice(0, i).trim()] = e.slice(i + 1).trim();
  }
  return out;
}

function CreateKeyDialog({ opened, onClose }: { opened: boolean; onClose: () => void }) {
  const qc = useQueryClient();
  const navigate = useNavigate();
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [tags, setTags] = useState<string[]>([]);
  const [period, setPeriod] = useState<number | string>("");
  const [activate, setActivate] = useState(true);
  const [kmipGroup, setKmipGroup] = useState("");
  const groups = useKmipGroups(opened);
  const reset = () => { setName(""); setDescription(""); setTags([]); setPeriod(""); setActivate(true); setKmipGroup(""); create.reset(); };
  const create = useMutation({
    mutationFn: () => call(api.POST("/api/v1/keys", { body: {
      name: name.trim(), description, tags: parseTags(tags), activate,
      rotation_period_days: typeof period === "number" ? period : null,
      ...(kmipGroup.trim() ? { kmip_group: kmipGroup.trim() } : {}),
    } })),
    onSuccess: (key) => {
      void qc.invalidateQueries({ queryKey: qk.keysAll });
      notifications.show({ color: "teal", title: "Key created", message: `${key.name} v1 is ${key.state}` });
      reset();
      onClose();
      navigate(`/keys/${encodeURIComponent(key.name)}`);
    },
  });
  const nameError = lengthError(name.trim(), LIMITS.keyName, create.error, "name");
  const descriptionError = lengthError(description, LIMITS.keyDescription, create.error, "description");
  const kmipGroupError = groupError(kmipGroup) ?? fieldError(create.error, "kmip_group");
  const invalid = !name.trim() || !!tooLong(name.trim(), LIMITS.keyName) || !!tooLong(description, LIMITS.keyDescription)
    || !!groupError(kmipGroup);
  return (
    <Modal opened={opened} onClose={() => { reset(); onClose(); }} title="Create key" centered size="lg">
      <form onSubmit={(e) => { e.preventDefault(); if (!invalid) create.mutate(); }} aria-label="Create key">
        <Stack gap="sm">
          <TextInput label="Name" required description="Unique; used in API calls (e.g. payments-db)" data-autofocus
                     value={name} onChange={(e) => setName(e.currentTarget.value)} error={nameError} />
          <Textarea label="Description" value={description} onChange={(e) => setDescription(e.currentTarget.value)}
                    autosize minRows={2} maxRows={12} error={descriptionError} />
          <TagsInput label="Tags" description="name=value, press Enter after each" value={tags} onChange={setTags}
                     placeholder="env=prod" clearable />
          <NumberInput label="Rotation period (days)" description="Leave empty for manual rotation only"
                       min={1} max={3650} value={period} onChange={setPeriod} allowDecimal={false} w={260} />
          <Autocomplete label="KMIP group (optional)" data={(groups.data ?? []).map((g) => g.name).sort()} value={kmipGroup}
                        onChange={setKmipGroup} error={kmipGroupError} comboboxProps={{ withinPortal: true }} w={{ base: "100%", sm: 360 }}
                        description="KMIP clients of this group see and use the key; empty: none does until it is assigned or granted"
                        data-testid="create-key-kmip-group" />
          <Switch label="Activate now" description="Otherwise the key is created Pre-Active"
                  checked={activate} onChange={(e) => setActivate(e.currentTarget.checked)} />
          <ErrorAlert error={create.error} title="Key not created" />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => { reset(); onClose(); }}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={invalid}>Create key</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
