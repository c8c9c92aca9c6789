import {
  Anchor, Button, Code, Drawer, Group, Menu, Modal, Paper, ScrollArea, Select, SimpleGrid, Stack, Table, Text,
  TextInput, UnstyledButton,
} from "@mantine/core";
import { IconDownload, IconSearch, IconShieldCheck } from "@tabler/icons-react";
import { useMutation, useQuery } from "@tanstack/react-query";
import { Fragment, useState } from "react";
import { useSearchParams } from "react-router";
import { ApiError, api, auditExportUrl, call, type AuditEvent } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { CopyValue, EmptyState, Loading, OutcomeBadge, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { STANDALONE_OBJECT_TYPES, kmipPath } from "../kmip";
import { VerifyResultView } from "./Dashboard";

const FILTERS = ["q", "actor", "action", "object_id", "outcome", "since", "until"] as const;
type FilterName = (typeof FILTERS)[number];
const PAGE = 50;

// Times are typed as they are shown everywhere here: ISO 8601 in UTC, "YYYY-MM-DD HH:mm"
// (or a day alone), never the browser's locale. Links may carry the "T" form.
const TIME_TYPED = /^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2}))?$/;
export const TIME_FORMAT_HINT = "YYYY-MM-DD HH:mm, in UTC";

/** A typed time (UTC) → ISO 8601 for the API; undefined when empty or not such a time. */
export function toIsoUtc(text: string): string | undefined {
  const m = TIME_TYPED.exec(text.trim());
  if (!m) return undefined;
  const [y, mo, d, h, mi] = m.slice(1).map((v) => Number(v ?? 0));
  const t = new Date(Date.UTC(y, mo - 1, d, h, mi));
  // Date.UTC rolls 2026-02-31 over into March and 25:00 into the next day: refuse those.
  if (t.getUTCMonth() !== mo - 1 || t.getUTCDate() !== d || h > 23 || mi > 59) return undefined;
  return t.toISOString();
}

/** What is wrong with a typed time, saying how to write it; null when it is fine or empty. */
export function timeError(text: string): string | null {
  return !text.trim() || toIsoUtc(text) ? null : `Write it as ${TIME_FORMAT_HINT}, e.g. 2026-11-26 14:30`;
}

// The API's limits on each filter (keyserver/api/routes/audit.py): a longer value is
// refused here, under its field, before anything is sent.
const MAX_LENGTH: Partial<Record<FilterName, number>> = { q: 200, actor: 300, action: 64, object_id: 4096 };

/** What is wrong with one typed filter, in words; null when it is fine or empty. */
export function filterError(f: FilterName, text: string): string | null {
  if (f === "since" || f === "until") return timeError(text);
  const max = MAX_LENGTH[f];
  return max && text.length > max
    ? `At most ${max.toLocaleString("en-US")} characters (this has ${text.length.toLocaleString("en-US")})` : null;
}

// The filters' names as the form labels them, for a refusal the server words by parameter.
const LABELS: [RegExp, string][] = [
  [/^Q\b/, "Search"], [/^Object id\b/, "Object ID"], [/^Since\b/, "From"],
  [/^Until\b/, "To"], [/^Before seq\b/, "Page"],
];

/** A refused filter read in the form's words ("Search: At most 200 characters"), not the
 *  query parameter's name. Other errors pass through as they are. */
export function auditFilterError(error: unknown): unknown {
  if (!(error instanceof ApiError) || error.status !== 422) return error;
  const detail = error.detail.split("; ").map((part) => LABELS.reduce((t, [from, to]) => t.replace(from, to), part))
    .join("; ");
  return new ApiError({ status: error.status, code: error.code, detail, requestId: error.requestId,
                        retryAfter: error.retryAfter, fields: { ...error.fields } });
}

export function AuditPage() {
  const [params, setParams] = useSearchParams();
  const get = (k: FilterName) => params.get(k) ?? "";
  const [draft, setDraft] = useState<Record<FilterName, string>>(
    () => Object.fromEntries(FILTERS.map((f) => [f, f === "since" || f === "until" ? get(f).replace("T", " ") : get(f)])) as
      Record<FilterName, string>);
  // Typed filters are judged once Apply was pressed; those of a link at once.
  const [checked, setChecked] = useState(() => FILTERS.some((f) => params.has(f)));
  const [cursors, setCursors] = useState<number[]>([]); // before_seq of each page after the first
  const before = cursors.at(-1);
  const filters = {
    q: get("q").trim() || undefined,
    actor: get("actor") || undefined,
    action: get("action") || undefined,
    object_id: get("object_id") || undefined,
    outcome: (get("outcome") || undefined) as "allowed" | "denied" | "error" | undefined,
    since: toIsoUtc(get("since")),
    until: toIsoUtc(get("until")),
  };
  // A link whose filters cannot be sent asks for nothing: the fields say what is wrong.
  const linkFaulty = FILTERS.some((f) => filterError(f, f === "since" || f === "until" ? get(f).replace("T", " ") : get(f)));
  const list = useQuery({
    queryKey: ["audit", "list", filters, before],
    enabled: !linkFaulty,
    queryFn: () => call(api.GET("/api/v1/audit/events", { params: { query: { ...filters, limit: PAGE, before_seq: before } } })),
    placeholderData: (prev) => prev,
  });
  const openSeq = params.get("seq");
  const [verifyOpen, setVerifyOpen] = useState(false);
  const verify = useMutation({ mutationFn: () => call(api.POST("/api/v1/audit/verify")) });

  const apply = (e?: React.FormEvent) => {
    e?.preventDefault();
    setChecked(true);
    if (FILTERS.some((f) => filterError(f, draft[f]))) return;
    const next = new URLSearchParams();
    for (const f of FILTERS) if (draft[f]) next.set(f, draft[f]);
    setCursors([]);
    setParams(next, { replace: true });
  };
  const clear = () => {
    setDraft(Object.fromEntries(FILTERS.map((f) => [f, ""])) as Record<FilterName, string>);
    setChecked(false);
    setCursors([]);
    setParams({}, { replace: true });
  };
  const openRecord = (seq: number | null) => {
    const next = new URLSearchParams(params);
    if (seq == null) next.delete("seq"); else next.set("seq", String(seq));
    setParams(next, { replace: true });
  };
  const exportFilters = Object.fromEntries(Object.entries(filters).filter(([, v]) => v)) as Record<string, string>;
  const set = (f: FilterName) => (e: React.ChangeEvent<HTMLInputElement>) => {
    const value = e.currentTarget.value;
    setDraft((d) => ({ ...d, [f]: value }));
  };

  return (
    <Stack gap="md">
      <PageHeader title="Audit log" subtitle="Append-only, HMAC-chained under a key held in the HSM. Newest first."
        actions={<>
          <GuardedButton perm="audit:verify" variant="default" leftSection={<IconShieldCheck size={16} />}
                         loading={verify.isPending} data-testid="verify-chain"
                         onClick={() => { setVerifyOpen(true); verify.mutate(); }}>Verify chain</GuardedButton>
          <Menu position="bottom-end">
            <Menu.Target>
              <Button variant="default" leftSection={<IconDownload size={16} />}>Export</Button>
            </Menu.Target>
            <Menu.Dropdown>
              <Menu.Label>Matching records, oldest first</Menu.Label>
              <Menu.Item component="a" href={auditExportUrl("csv", exportFilters)} download data-testid="export-csv">CSV</Menu.Item>
              <Menu.Item component="a" href={auditExportUrl("jsonl", exportFilters)} download data-testid="export-json">JSON lines</Menu.Item>
            </Menu.Dropdown>
          </Menu>
        </>} />
      <Paper withBorder radius="md" p="sm">
        <form onSubmit={apply} aria-label="Audit filters">
          <Group gap="xs" align="flex-end">
            <TextInput label="Search" placeholder="words, pay* for a prefix" value={draft.q} onChange={set("q")} w={210}
                       leftSection={<IconSearch size={14} />} data-testid="audit-search" error={checked && filterError("q", draft.q)}
                       description="Every word, in any field or detail" inputWrapperOrder={["label", "input", "description", "error"]} />
            <TextInput label="Actor" placeholder="alice or host:db-*" value={draft.actor} onChange={set("actor")} w={140}
                       error={checked && filterError("actor", draft.actor)} data-testid="audit-actor"
                       description="* at the end: prefix" inputWrapperOrder={["label", "input", "description", "error"]} />
            <TextInput label="Action" placeholder="key. or key.rotate" value={draft.action} onChange={set("action")} w={150}
                       error={checked && filterError("action", draft.action)} />
            <TextInput label="Object ID" placeholder="key UUID, user id…" value={draft.object_id} onChange={set("object_id")} w={170}
                       error={checked && filterError("object_id", draft.object_id)}
                       description="* at the end: prefix" inputWrapperOrder={["label", "input", "description", "error"]} />
            <Select label="Outcome" placeholder="Any" clearable data={["allowed", "denied", "error"]} w={100}
                    value={draft.outcome || null} onChange={(v) => setDraft((d) => ({ ...d, outcome: v ?? "" }))} />
            <TextInput label="From (UTC)" placeholder="YYYY-MM-DD HH:mm" value={draft.since} onChange={set("since")} w={168}
                       error={checked && timeError(draft.since)} data-testid="audit-since" />
            <TextInput label="To (UTC)" placeholder="YYYY-MM-DD HH:mm" value={draft.until} onChange={set("until")} w={168}
                       error={checked && timeError(draft.until)} data-testid="audit-until" />
            <Button type="submit" color="ink">Apply</Button>
            <Button variant="subtle" color="gray" onClick={clear}>Clear</Button>
          </Group>
        </form>
      </Paper>
      <Paper withBorder radius="md">
        {linkFaulty ? <EmptyState title="These filters cannot be applied">Correct the fields marked above, then press Apply.</EmptyState> :
          list.error ? <ErrorAlert error={auditFilterError(list.error)} /> : list.isPending ? <Loading label="Loading audit records…" /> :
          list.data.items.length === 0 ? <EmptyState title="No records match">Widen the time range or clear filters.</EmptyState> : (
            <Table.ScrollContainer minWidth={900}>
              <Table highlightOnHover fz="sm" verticalSpacing={6} data-testid="audit-table"
                     data-stale={list.isPlaceholderData} style={{ opacity: list.isPlaceholderData ? 0.55 : 1 }}>
                <Table.Thead><Table.Tr>
                  <Table.Th>#</Table.Th><Table.Th>Time</Table.Th><Table.Th>Actor</Table.Th><Table.Th>Action</Table.Th>
                  <Table.Th>Object</Table.Th><Table.Th>Outcome</Table.Th><Table.Th>Source</Table.Th>
                </Table.Tr></Table.Thead>
                <Table.Tbody>
                  {list.data.items.map((e) => (
                    <Table.Tr key={e.seq} style={{ cursor: "pointer" }} onClick={() => openRecord(e.seq)}>
                      <Table.Td>
                        <UnstyledButton onClick={(ev) => { ev.stopPropagation(); openRecord(e.seq); }}
                                        aria-label={`Open audit record ${e.seq}`} c="var(--sr-link)" fz="sm">{e.seq}</UnstyledButton>
                      </Table.Td>
                      <Table.Td style={{ whiteSpace: "nowrap" }}>{fmtTime(e.time)}</Table.Td>
                      <Table.Td>{e.actor}</Table.Td>
                      <Table.Td><Text size="sm" ff="monospace">{e.action}</Text></Table.Td>
                      <Table.Td><ObjectCell e={e} /></Table.Td>
                      <Table.Td><OutcomeBadge outcome={e.outcome} /></Table.Td>
                      <Table.Td>{e.source_ip ?? "—"}</Table.Td>
                    </Table.Tr>
                  ))}
                </Table.Tbody>
              </Table>
            </Table.ScrollContainer>
          )}
      </Paper>
      {list.data && list.data.total > 0 && (
        <Group justify="space-between">
          <Text size="sm" c="dimmed" data-testid="audit-total">
            {list.data.total.toLocaleString("en-US")}{list.data.total_exact ? "" : "+"} matching records
          </Text>
          <Group gap="xs">
            <Button size="xs" variant="default" disabled={!cursors.length} onClick={() => setCursors((c) => c.slice(0, -1))}>Newer</Button>
            <Button size="xs" variant="default" disabled={list.data.next_before_seq == null}
                    onClick={() => setCursors((c) => [...c, list.data.next_before_seq as number])}>Older</Button>
          </Group>
        </Group>
      )}
      <AuditDrawer seq={openSeq ? Number(openSeq) : null} onClose={() => openRecord(null)} />
      <Modal opened={verifyOpen} onClose={() => setVerifyOpen(false)} title="Audit chain verification" centered>
        {verify.error ? <ErrorAlert error={verify.error} /> : verify.data ? <VerifyResultView result={verify.data} />
          : <Loading label="Walking the chain…" />}
      </Modal>
    </Stack>
  );
}

/** The object by its name when the record has one (its id is in the drawer and on hover),
 *  else by its type and id. */
function ObjectCell({ e }: { e: AuditEvent }) {
  if (!e.object_name) {
    return <Text size="xs" ff="monospace" lineClamp={1} maw={260} title={e.object_id ?? undefined}>
      {e.object_type ? `${e.object_type}:` : ""}{e.object_id ?? "—"}</Text>;
  }
  return (
    <div title={e.object_id ?? undefined} data-testid="audit-object">
      <Text size="sm" lineClamp={1} maw={260} style={{ overflowWrap: "anywhere" }}>{e.object_name}</Text>
      {e.object_type && <Text size="xs" c="dimmed">{e.object_type.replace(/_/g, " ")}</Text>}
    </div>
  );
}

function AuditDrawer({ seq, onClose }: { seq: number | null; onClose: () => void }) {
  const { can } = useAuth();
  const q = useQuery({
    queryKey: ["audit", "one", seq],
    queryFn: () => call(api.GET("/api/v1/audit/events/{seq}", { params: { path: { seq: seq as number } } })),
    enabled: seq != null && can("audit:read"),
  });
  return (
    <Drawer opened={seq != null} onClose={onClose} position="right" size="lg" title={<Text fw={650}>Audit record #{seq}</Text>}
            scrollAreaComponent={ScrollArea.Autosize}>
      {q.error ? <ErrorAlert error={q.error} /> : q.isPending ? <Loading /> : <RecordView e={q.data} />}
    </Drawer>
  );
}

export function RecordView({ e }: { e: AuditEvent }) {
  const { can } = useAuth();
  const rows: [string, React.ReactNode][] = [
    ["Sequence", e.seq], ["Time", fmtTime(e.time)], ["Actor", `${e.actor} (${e.actor_type})`],
    ["Action", <Code key="a">{e.action}</Code>], ["Outcome", <OutcomeBadge key="o" outcome={e.outcome} />],
    ["Object type", e.object_type ?? "—"], ["Object", e.object_name ?? "—"], ["Object ID", e.object_id ?? "—"],
    ["Source address", e.source_ip ?? "—"], ["Request ID", e.request_id ?? "—"],
  ];
  return (
    <Stack gap="md" data-testid="audit-record">
      {/* Long values (UUIDs, paths, details) wrap inside the drawer: on a phone it never
          scrolls sideways, away from its own close button. */}
      <SimpleGrid cols={2} spacing={6} style={{ gridTemplateColumns: "minmax(6rem, 140px) minmax(0, 1fr)" }}>
        {rows.map(([k, v]) => <Fragment key={k}><Text size="sm" c="dimmed">{k}</Text>
          <Text size="sm" component="div" style={{ overflowWrap: "anywhere" }}>{v}</Text></Fragment>)}
      </SimpleGrid>
      <div>
        <Text size="sm" c="dimmed" mb={4}>Details</Text>
        <Code block style={{ whiteSpace: "pre-wrap", overflowWrap: "anywhere" }}>{JSON.stringify(e.details, null, 2)}</Code>
      </div>
      <Hash label="Previous hash" value={e.prev_hash} />
      <Hash label="Record hash (HMAC-SHA-256)" value={e.hash} />
      {e.object_type === "key" && e.object_id && (
        <Anchor href={`#/keys/${encodeURIComponent(e.object_id)}`} size="sm">Open key</Anchor>
      )}
      {/* A standalone KMIP object has no page of its own: its grants are made from here. */}
      {STANDALONE_OBJECT_TYPES.has(e.object_type ?? "") && e.object_id && can("kmip:clients") && (
        <Anchor href={`#${kmipPath("grants", { grant_object: e.object_id })}`} size="sm" data-testid="audit-grant-object">
          Grant KMIP access to this {e.object_type?.replace(/_/g, " ")}</Anchor>
      )}
    </Stack>
  );
}

function Hash({ label, value }: { label: string; value: string }) {
  return (
    <div>
      <Group gap={4}><Text size="sm" c="dimmed">{label}</Text><CopyValue value={value} label={`Copy ${label.toLowerCase()}`} /></Group>
      <Code block style={{ wordBreak: "break-all", whiteSpace: "pre-wrap" }}>{value}</Code>
    </div>
  );
}
