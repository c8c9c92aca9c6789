import {
  ActionIcon, Alert, Anchor, Badge, Button, Checkbox, Drawer, Group, Modal, Paper, SegmentedControl, Select,
  Stack, Table, TagsInput, Text, TextInput, Tooltip,
} from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconArrowDown, IconArrowUp, IconInfoCircle, IconPlus, IconTrash } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";
import { api, call, type Key, type Schemas } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { useHosts, useKeys } from "../queries";

export type GuardPoint = Schemas["GuardPointPublic"];
export type Rule = Schemas["RuleModel"];
type Body = Schemas["GuardPointIn"];

const GP_KEY = ["guard-points"] as const;
const CHUNKS = ["512", "1024", "2048", "4096", "8192", "16384", "32768", "65536", "131072", "262144", "524288", "1048576"];

export const MODE_HELP = {
  enforce: "The rules decide. A denied access fails with “permission denied” and is recorded in the audit log.",
  learn: "Everything is allowed; what enforce would deny is recorded (agent.access.would_deny). Run a new policy in "
    + "learn mode, read the audit log, then switch to enforce.",
  off: "Encryption off: the path shows the backing files exactly as stored — encrypted files read as ciphertext, "
    + "new files are written in clear (and encrypted when the mode returns to learn or enforce). No rule applies. "
    + "Use it to unprotect a directory, or for maintenance; never leave data you care about in this mode.",
} as const;

type Action = "rekey" | "unprotect" | "delete";
const ACTIONS: Record<Action, { title: string; button: string; explain: (gp: GuardPoint) => string; done: (gp: GuardPoint) => string }> = {
  rekey: {
    title: "Re-key", button: "Re-key",
    explain: () => "Every file that exists now is re-encrypted under a fresh file key, online: applications keep working, "
      + "each file waits briefly while it is sealed anew. Hosts report progress on their page.",
    done: (gp) => `Hosts re-encrypt ${gp.path} and report progress`,
  },
  unprotect: {
    title: "Unprotect", button: "Decrypt in place",
    explain: (gp) => `Hosts decrypt every file of ${gp.path} in place, in ${gp.backing_path} (resumable; progress on `
      + "each host's page). Delete the guard point afterwards: the files go back to the path, in clear.",
    done: (gp) => `Hosts decrypt ${gp.path} and report progress`,
  },
  delete: {
    title: "Delete", button: "Delete guard point",
    explain: (gp) => gp.mode === "off" && gp.unprotect_generation
      ? "Hosts unmount it at their next heartbeat. Where it was unprotected, its files move back to the path, in clear."
      : "Hosts unmount it at their next heartbeat. The ciphertext stays in the backing directory; to get plaintext back, "
        + "set the mode to off and unprotect it first.",
    done: (gp) => `Hosts unmount ${gp.path}`,
  },
};

/** A new rule refuses until the person opens it up: in a first-match list, a blank
 *  "permit everything to everyone" would quietly grant every access after it. */
export function emptyRule(): Rule {
  return { effect: "deny", users: [], uids: [], groups: [], executables: [], access: "all", audit: false };
}

function everyone(r: Rule): boolean {
  return !(r.users ?? []).length && !(r.uids ?? []).length && !(r.groups ?? []).length && !(r.executables ?? []).length;
}

/** One line per rule, as people read them: "permit read to postgres via /usr/bin/postgres". */
export function describeRule(r: Rule): string {
  const who = [...(r.users ?? []), ...(r.uids ?? []).map((u) => `uid ${u}`), ...(r.groups ?? []).map((g) => `group ${g}`)];
  const via = (r.executables ?? []).length ? ` via ${(r.executables ?? []).join(", ")}` : "";
  const what = r.access === "all" ? "read and write" : r.access;
  return `${r.effect} ${what} to ${who.length ? who.join(", ") : "everyone"}${via}${r.audit ? " (audited)" : ""}`;
}

export function RulesEditor({ rules, onChange, readOnly }: { rules: Rule[]; onChange: (r: Rule[]) => void; readOnly?: boolean }) {
  const set = (i: number, patch: Partial<Rule>) => onChange(rules.map((r, j) => (j === i ? { ...r, ...patch } : r)));
  const move = (i: number, by: number) => {
    const next = [...rules];
    const [r] = next.splice(i, 1);
    next.splice(i + by, 0, r);
    onChange(next);
  };
  return (
    <Stack gap="xs" data-testid="rules-editor">
      {rules.length === 0 && <Text size="sm" c="dimmed">No rules: the default decides every access.</Text>}
      {rules.map((r, i) => (
        <Paper key={i} withBorder radius="sm" p="xs" data-testid="rule">
          <Group justify="space-between" mb={6}>
            <Stack gap={0}>
              <Text size="xs" fw={600}>Rule {i + 1} — {describeRule(r)}</Text>
              {everyone(r) && (
                <Text size="xs" c={r.effect === "permit" ? "var(--sr-text-warning)" : "dimmed"} data-testid="rule-everyone">
                  Applies to every user and program: name users, groups, UIDs or executables to narrow it.
                </Text>
              )}
            </Stack>
            {!readOnly && (
              <Group gap={2}>
                <ActionIcon variant="subtle" aria-label={`Move rule ${i + 1} up`} disabled={i === 0} onClick={() => move(i, -1)}>
                  <IconArrowUp size={14} /></ActionIcon>
                <ActionIcon variant="subtle" aria-label={`Move rule ${i + 1} down`} disabled={i === rules.length - 1}
                            onClick={() => move(i, 1)}><IconArrowDown size={14} /></ActionIcon>
                <ActionIcon variant="subtle" color="red" aria-label={`Remove rule ${i + 1}`}
                            onClick={() => onChange(rules.filter((_, j) => j !== i))}><IconTrash size={14} /></ActionIcon>
              </Group>
            )}
          </Group>
          <Group grow align="flex-start" gap="xs">
            <Select label="Effect" data={["permit", "deny"]} value={r.effect} disabled={readOnly} allowDeselect={false}
                    onChange={(v) => v && set(i, { effect: v as Rule["effect"] })} />
            <Select label="Access" data={["all", "read", "write"]} value={r.access ?? "all"} disabled={readOnly}
                    allowDeselect={false} onChange={(v) => v && set(i, { access: v as Rule["access"] })} />
          </Group>
          <Group grow align="flex-start" gap="xs" mt={4}>
            <TagsInput label="Users" placeholder="postgres" value={r.users ?? []} disabled={readOnly}
                       onChange={(v) => set(i, { users: v })} />
            <TagsInput label="Groups" placeholder="dba" value={r.groups ?? []} disabled={readOnly}
                       onChange={(v) => set(i, { groups: v })} />
            <TagsInput label="UIDs" placeholder="1001" value={(r.uids ?? []).map(String)} disabled={readOnly}
                       onChange={(v) => set(i, { uids: v.map(Number).filter((n) => Number.isInteger(n) && n >= 0) })} />
          </Group>
          <TagsInput mt={4} label="Executables" description="Absolute paths, as /proc/PID/exe shows them; empty: any program"
                     placeholder="/usr/lib/postgresql/15/bin/postgres" value={r.executables ?? []} disabled={readOnly}
                     onChange={(v) => set(i, { executables: v })} />
          <Checkbox mt={6} size="xs" label="Audit permitted accesses too (denials always are)" checked={!!r.audit}
                    disabled={readOnly} onChange={(e) => set(i, { audit: e.currentTarget.checked })} />
        </Paper>
      ))}
      {!readOnly && (
        <Button variant="light" size="xs" leftSection={<IconPlus size={14} />} onClick={() => onChange([...rules, emptyRule()])}
                w="fit-content">Add rule</Button>
      )}
    </Stack>
  );
}

interface Draft {
  target: "group" | "host";
  host_group: string;
  host_id: string | null;
  path: string;
  backing_path: string;
  key: string | null;
  chunk_size: string;
  mode: "enforce" | "learn" | "off";
  default_effect: "permit" | "deny";
  rules: Rule[];
}

export function draftFrom(gp?: GuardPoint): Draft {
  return gp ? {
    target: gp.host_id ? "host" : "group", host_group: gp.host_group ?? "", host_id: gp.host_id ?? null, path: gp.path,
    backing_path: gp.backing_path, key: gp.key_id, chunk_size: String(gp.chunk_size), mode: gp.mode as Draft["mode"],
    default_effect: gp.default_effect as Draft["default_effect"], rules: gp.rules,
  } : {
    target: "group", host_group: "", host_id: null, path: "", backing_path: "", key: null, chunk_size: "4096",
    mode: "learn", default_effect: "deny", rules: [],
  };
}

export function bodyFrom(d: Draft): Body {
  return {
    host_group: d.target === "group" ? d.host_group.trim() : null, host_id: d.target === "host" ? d.host_id : null,
    path: d.path.trim(), backing_path: d.backing_path.trim() || null, key: d.key ?? "", chunk_size: Number(d.chunk_size),
    mode: d.mode, default_effect: d.default_effect, rules: d.rules,
  };
}

/** Active AES keys as choices: the key's id is the value (KMIP clients may give several
 * keys one name), its name the label, with a short id where names repeat. */
export function keyOptions(keys: Key[]): { value: string; label: string }[] {
  const usable = keys.filter((k) => k.state === "active" && k.algorithm === "AES");
  const seen = new Map<string, number>();
  for (const k of usable) seen.set(k.name, (seen.get(k.name) ?? 0) + 1);
  return usable.map((k) => ({ value: k.id, label: (seen.get(k.name) ?? 0) > 1 ? `${k.name} (${k.id.slice(0, 8)})` : k.name }));
}

function GuardPointEditor({ editing, opened, onClose }: { editing: GuardPoint | null; opened: boolean; onClose: () => void }) {
  const { can } = useAuth();
  const readOnly = !can("guardpoints:manage");
  const qc = useQueryClient();
  // Mounted afresh for every opening (GuardPointsPage keys it), so a cancelled or created
  // draft never comes back as the next "New guard point".
  const [draft, setDraft] = useState<Draft>(() => draftFrom(editing ?? undefined));
  // Active keys found by the server as the person types: a deployment has more keys than
  // one page. The chosen one stays offered whatever the search shows.
  const [keySearch, setKeySearch] = useState("");
  const [chosenKey, setChosenKey] = useState<{ value: string; label: string } | null>(null);
  const keys = useKeys({ q: keySearch.replace(/ \([0-9a-f]{8}\)$/, "") || undefined, state: "active", limit: 100, offset: 0 },
                       opened);
  const keyData = keyOptions(keys.data?.items ?? []);
  if (chosenKey && !keyData.some((o) => o.value === chosenKey.value)) keyData.unshift(chosenKey);
  if (draft.key && !keyData.some((o) => o.value === draft.key) && editing?.key_id === draft.key) {
    keyData.unshift({ value: editing.key_id, label: editing.key_name });
  }
  const hosts = useHosts(opened);
  const save = useMutation({
    mutationFn: () => editing
      ? call(api.PUT("/api/v1/guard-points/{gp_id}", { params: { path: { gp_id: editing.id } }, body: bodyFrom(draft) }))
      : call(api.POST("/api/v1/guard-points", { body: bodyFrom(draft) })),
    onSuccess: (gp) => {
      void qc.invalidateQueries({ queryKey: GP_KEY });
      notifications.show({ color: "teal", title: editing ? "Guard point updated" : "Guard point created",
                           message: `${gp.path}: revision ${gp.revision}; hosts apply it at their next heartbeat` });
      onClose();
    },
  });
  const set = (patch: Partial<Draft>) => setDraft((d) => ({ ...d, ...patch }));
  const fixed = !!editing;
  return (
    <Drawer opened={opened} onClose={onClose} position="right" size="xl" title={editing ? `Guard point ${editing.path}` : "New guard point"}>
      <form aria-label="Guard point" onSubmit={(e) => { e.preventDefault(); save.mutate(); }}>
        <Stack gap="sm">
          <SegmentedControl value={draft.target} disabled={readOnly} onChange={(v) => set({ target: v as Draft["target"] })}
                            data={[{ value: "group", label: "Every host of a group" }, { value: "host", label: "One host" }]} />
          {draft.target === "group" ? (
            <TextInput label="Host group" required placeholder="db-servers" value={draft.host_group} disabled={readOnly}
                       onChange={(e) => set({ host_group: e.currentTarget.value })} />
          ) : (
            <Select label="Host" required searchable disabled={readOnly} value={draft.host_id}
                    data={(hosts.data?.items ?? []).filter((h) => h.state === "active").map((h) => ({ value: h.id, label: `${h.hostname} (${h.host_group})` }))}
                    onChange={(v) => set({ host_id: v })} />
          )}
          <TextInput label="Protected path" description="The directory applications use; files already there are protected in place"
                     required placeholder="/srv/postgres" value={draft.path} disabled={readOnly || fixed}
                     onChange={(e) => set({ path: e.currentTarget.value })} />
          <TextInput label="Backing path" description="Where the ciphertext lives; default: beside it, hidden (/srv/.postgres.strongroom)"
                     placeholder="(default)" value={draft.backing_path} disabled={readOnly || fixed}
                     onChange={(e) => set({ backing_path: e.currentTarget.value })} />
          <Group grow>
            <Select label="Key" required searchable allowDeselect={false} disabled={readOnly || fixed} value={draft.key}
                    data={keyData} searchValue={keySearch} onSearchChange={setKeySearch}
                    filter={({ options }) => options /* the server filtered them */}
                    onChange={(v, option) => { set({ key: v }); setChosenKey(v ? option : null); }}
                    nothingFoundMessage={keys.isFetching ? "Searching…" : "No active AES key matches"} />
            <Select label="Chunk size (bytes)" data={CHUNKS} value={draft.chunk_size} disabled={readOnly} allowDeselect={false}
                    onChange={(v) => v && set({ chunk_size: v })} />
          </Group>
          <Stack gap={4}>
            <Text size="sm" fw={500}>Mode</Text>
            <SegmentedControl value={draft.mode} disabled={readOnly} onChange={(v) => set({ mode: v as Draft["mode"] })}
                              data={[{ value: "learn", label: "Learn" }, { value: "enforce", label: "Enforce" },
                                     { value: "off", label: "Off" }]} />
            {draft.mode === "off"
              ? <Alert variant="light" color="red" icon={<IconInfoCircle size={18} />} data-testid="mode-help">
                  <Text size="xs">{MODE_HELP.off}</Text></Alert>
              : <Text size="xs" c="dimmed" data-testid="mode-help">{MODE_HELP[draft.mode]}</Text>}
          </Stack>
          <Text size="sm" fw={500}>Rules (first match wins)</Text>
          <RulesEditor rules={draft.rules} readOnly={readOnly} onChange={(rules) => set({ rules })} />
          <Group gap="xs" align="center">
            <Text size="sm">When no rule matches:</Text>
            <SegmentedControl size="xs" value={draft.default_effect} disabled={readOnly}
                              onChange={(v) => set({ default_effect: v as Draft["default_effect"] })}
                              data={[{ value: "deny", label: "Deny" }, { value: "permit", label: "Permit" }]} />
          </Group>
          <ErrorAlert error={save.error} title="Not saved" />
          {!readOnly && (
            <Group justify="flex-end">
              <Button variant="default" onClick={onClose}>Cancel</Button>
              <Button type="submit" color="ink" loading={save.isPending}
                      disabled={!draft.path.trim() || !draft.key || (draft.target === "group" ? !draft.host_group.trim() : !draft.host_id)}>
                {editing ? "Save (new revision)" : "Create guard point"}</Button>
            </Group>
          )}
        </Stack>
      </form>
    </Drawer>
  );
}

export function GuardPointsPage() {
  const { can } = useAuth();
  const manage = can("guardpoints:manage");
  const qc = useQueryClient();
  const list = useQuery({ queryKey: GP_KEY, queryFn: () => call(api.GET("/api/v1/guard-points")) });
  const [editing, setEditing] = useState<GuardPoint | null>(null);
  const [open, setOpen] = useState(false);
  const [session, setSession] = useState(0); // one editor per opening: a fresh draft each time
  const [confirm, setConfirm] = useState<{ gp: GuardPoint; action: Action } | null>(null);
  const act = useMutation({
    mutationFn: ({ gp, action }: { gp: GuardPoint; action: Action }) => {
      const params = { params: { path: { gp_id: gp.id } } };
      return action === "rekey" ? call(api.POST("/api/v1/guard-points/{gp_id}/rekey", params))
        : action === "unprotect" ? call(api.POST("/api/v1/guard-points/{gp_id}/unprotect", params))
        : call(api.DELETE("/api/v1/guard-points/{gp_id}", params));
    },
    onSuccess: (_, { gp, action }) => {
      void qc.invalidateQueries({ queryKey: GP_KEY });
      notifications.show({ color: "teal", title: `${ACTIONS[action].title}: requested`, message: ACTIONS[action].done(gp) });
      setConfirm(null);
    },
  });
  return (
    <Stack gap="md">
      <PageHeader title="Guard points" subtitle="Directories on hosts where applications see plaintext and the disk holds only ciphertext."
        actions={manage && <Button color="ink" leftSection={<IconPlus size={16} />} data-testid="new-guard-point"
                                   onClick={() => { setEditing(null); setSession((n) => n + 1); setOpen(true); }}>New guard point</Button>} />
      <Alert variant="light" color="blue" icon={<IconInfoCircle size={18} />}>
        <Text size="sm"><b>Learn</b>: {MODE_HELP.learn} <b>Enforce</b>: {MODE_HELP.enforce} <b>Off</b>: encryption
          off, the files as stored (to unprotect a directory).</Text>
      </Alert>
      <Paper withBorder radius="md">
        {list.error ? <ErrorAlert error={list.error} /> : list.isPending ? <Loading /> : list.data.length === 0 ? (
          <EmptyState title="No guard points">Create one for a host group and a path; its hosts mount it at their next heartbeat.</EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={900}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="guard-points-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Path</Table.Th><Table.Th>Hosts</Table.Th><Table.Th>Key</Table.Th><Table.Th>Mode</Table.Th>
                <Table.Th>Rules</Table.Th><Table.Th>Revision</Table.Th><Table.Th>Updated</Table.Th><Table.Th />
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {list.data.map((gp) => (
                  <Table.Tr key={gp.id}>
                    <Table.Td><Anchor component="button" type="button" fw={600} size="sm" ff="monospace"
                                      onClick={() => { setEditing(gp); setSession((n) => n + 1); setOpen(true); }}>{gp.path}</Anchor>
                      <Text size="xs" c="dimmed" ff="monospace">{gp.backing_path}</Text></Table.Td>
                    <Table.Td>{gp.host_group ? `group ${gp.host_group}` : <Text size="sm" ff="monospace">host {gp.host_id?.slice(0, 8)}</Text>}</Table.Td>
                    <Table.Td><Anchor component={Link} to={`/keys/${gp.key_id}`} size="sm">{gp.key_name}</Anchor></Table.Td>
                    <Table.Td><Badge variant="light" radius="sm" color={gp.mode === "enforce" ? "teal" : gp.mode === "off" ? "red" : "yellow"}>
                      {gp.mode === "off" ? "off · encryption off" : gp.mode}</Badge></Table.Td>
                    <Table.Td><Tooltip multiline w={360} withArrow label={gp.rules.length
                        ? gp.rules.map((r, i) => `${i + 1}. ${describeRule(r)}`).join("\n") : "no rules"}>
                      <Text size="sm" tabIndex={0}>{gp.rules.length} · default {gp.default_effect}</Text></Tooltip></Table.Td>
                    <Table.Td>{gp.revision}{gp.rekey_generation ? <Text span size="xs" c="dimmed"> · re-key {gp.rekey_generation}</Text> : null}
                      {gp.unprotect_generation ? <Text span size="xs" c="dimmed"> · unprotect {gp.unprotect_generation}</Text> : null}</Table.Td>
                    <Table.Td title={fmtTime(gp.updated_at)} style={{ whiteSpace: "nowrap" }}>{fmtRelative(gp.updated_at)}</Table.Td>
                    <Table.Td>{manage && (
                      <Group gap={4} wrap="nowrap">
                        {gp.mode === "off"
                          ? <Button size="compact-sm" variant="subtle" onClick={() => setConfirm({ gp, action: "unprotect" })}
                                    aria-label={`Unprotect ${gp.path}`}>Unprotect</Button>
                          : <Button size="compact-sm" variant="subtle" onClick={() => setConfirm({ gp, action: "rekey" })}
                                    aria-label={`Re-key ${gp.path}`}>Re-key</Button>}
                        <Button size="compact-sm" variant="subtle" color="red" onClick={() => setConfirm({ gp, action: "delete" })}
                                aria-label={`Delete ${gp.path}`}>Delete</Button>
                      </Group>)}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
      <GuardPointEditor key={session} editing={editing} opened={open} onClose={() => setOpen(false)} />
      <Modal opened={!!confirm} onClose={() => setConfirm(null)} centered
             title={confirm ? `${ACTIONS[confirm.action].title} ${confirm.gp.path}` : ""}>
        <Stack gap="sm">
          <Text size="sm">{confirm && ACTIONS[confirm.action].explain(confirm.gp)}</Text>
          <ErrorAlert error={act.error} />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setConfirm(null)}>Cancel</Button>
            <Button color={confirm?.action === "delete" ? "red" : "dark"} loading={act.isPending}
                    onClick={() => confirm && act.mutate(confirm)}>{confirm && ACTIONS[confirm.action].button}</Button>
          </Group>
        </Stack>
      </Modal>
    </Stack>
  );
}
