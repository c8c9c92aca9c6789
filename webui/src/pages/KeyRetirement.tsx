// Retiring a key version (decision 0024), on the key's page: per older version, what still
// uses it (the inventory, in a drawer) and the held retirement that moves every holder to
// the newest version, ending in a signed zero-use statement in the audit chain.
import {
  Alert, Anchor, Badge, Button, Checkbox, Drawer, Group, Modal, Paper, Progress, SimpleGrid, Stack, Table,
  Text, Textarea, Title,
} from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";
import type { Key, KeyVersion } from "../api/client";
import { heldDetail } from "../approvals";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import {
  HOLDER_STATE, countText, kindLabel, progressOf, retirementApi, rq, unreadableHolders, useInventory, type Holder,
  type Inventory,
  type ExclusionKind, type Retirement, type VersionInUse,
} from "../retirement";

const RETIREMENT_COLOR: Record<string, string> = { running: "blue", complete: "teal", cancelled: "gray" };

/** Versions older than the newest: those a retirement can move holders off. */
export const retirable = (k: Key, v: KeyVersion) =>
  v.version < Math.max(...k.versions.map((x) => x.version)) && v.state !== "destroyed" && v.state !== "destroyed-compromised";

/** The Versions panel's buttons for one older version, with its retirement's state. */
export function VersionActions({ v, retirement, onInventory, onRetire }: {
  v: KeyVersion; retirement?: Retirement; onInventory: () => void; onRetire: () => void;
}) {
  const r = retirement;
  return (
    <Group gap="xs" mt={4} wrap="wrap">
      {r && r.state !== "cancelled" && (
        <Badge color={RETIREMENT_COLOR[r.state]} variant="light" radius="sm" style={{ overflow: "visible" }}
               data-testid={`retirement-v${v.version}`} data-state={r.state}>
          {r.state === "running" ? "retiring" : "retired"}
        </Badge>
      )}
      <Button size="compact-xs" variant="default" onClick={onInventory} aria-label={`Inventory of v${v.version}`}
              data-testid={`inventory-v${v.version}`}>Inventory</Button>
      {r?.state !== "running" && r?.state !== "complete" && (
        <GuardedButton perm="keys:destroy" mode="hide" size="compact-xs" variant="default" color="orange" onClick={onRetire}
                       data-testid={`retire-v${v.version}`}>Retire v{v.version}…</GuardedButton>
      )}
    </Group>
  );
}

export function HolderStateBadge({ state }: { state: Holder["state"] }) {
  const s = HOLDER_STATE[state] ?? { color: "gray", label: state };
  return <Badge color={s.color} variant="light" radius="sm" data-state={state} style={{ overflow: "visible" }}>{s.label}</Badge>;
}

function useRetirementRefresh() {
  const qc = useQueryClient();
  return () => {
    void qc.invalidateQueries({ queryKey: rq.all }); // this inventory and the list of retirements
    void qc.invalidateQueries({ queryKey: ["keys", "one"] });
    // The audit chainer appends records a moment after the request commits.
    for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
  };
}

/** The version last opened: while a drawer or dialog closes, it still shows what it showed. */
function useLastVersion(version: number | null) {
  const [last, setLast] = useState(version);
  if (version != null && version !== last) setLast(version);
  return version ?? last;
}

/** What still uses one version of the key, and its retirement. */
export function InventoryDrawer({ k, version, onClose, onRetire }: {
  k: Key; version: number | null; onClose: () => void; onRetire: (version: number) => void;
}) {
  const shown = useLastVersion(version);
  return (
    // The drawer scrolls natively: a Mantine ScrollArea there grows to its content's
    // narrowest width, and the holders' table would widen it past a phone's screen.
    <Drawer opened={version != null} onClose={onClose} position="right" size="xl"
            title={<Text fw={650} style={{ overflowWrap: "anywhere" }}>Inventory of {k.name} v{shown}</Text>}>
      {shown != null && <InventoryView k={k} version={shown} onRetire={() => onRetire(shown)} />}
    </Drawer>
  );
}

export function InventoryView({ k, version, onRetire }: { k: Key; version: number; onRetire: () => void }) {
  const inv = useInventory(k.id, version);
  const { can } = useAuth();
  const [excluding, setExcluding] = useState<Excluded | null>(null);
  if (inv.error) return <ErrorAlert error={inv.error} title="The inventory could not be computed" />;
  if (inv.isPending) return <Loading label="Counting what uses this version…" />;
  const i = inv.data;
  const running = i.retirement?.state === "running";
  const v = k.versions.find((x) => x.version === version);
  return (
    <Stack gap="md" data-testid="inventory">
      <Alert variant="light" color={i.in_use ? "orange" : "teal"} data-testid="inventory-summary"
             title={i.in_use ? `v${version} is in use` : `Nothing uses v${version}`}>
        <Text size="sm">
          {i.in_use
            ? "Something still holds data under this version: destroying it would make that data unreadable. "
              + (running ? "The retirement below is moving every holder to the newest version."
                : "Retire it to move every holder to the newest version, with a signed statement when none is left.")
            : i.retirement?.state === "complete" ? "Its retirement is complete: the version can be destroyed."
            : "Every holder is clear or excluded."}
        </Text>
        <Text size="xs" c="dimmed" mt={4}>computed {fmtTime(i.computed_at)}</Text>
      </Alert>
      <SimpleGrid cols={{ base: 2, sm: 3 }} spacing="xs" data-testid="inventory-kinds">
        {Object.entries(i.kinds).map(([kind, n]) => (
          <Paper key={kind} withBorder radius="sm" p="xs" data-kind={kind}>
            <Text size="xs" c="dimmed">{kindLabel(kind)}</Text>
            <Text fw={650}>{n.toLocaleString("en")}</Text>
          </Paper>
        ))}
      </SimpleGrid>
      {i.unreported_hosts.length > 0 && (
        <Alert variant="light" color="red" title="Hosts that have not reported" data-testid="unreported-hosts">
          <Text size="sm">{i.unreported_hosts.join(", ")}: {i.unreported_hosts.length === 1 ? "it holds" : "they hold"} the
            key and {i.unreported_hosts.length === 1 ? "has" : "have"} not reported since the retirement began, so the
            retirement cannot complete. Bring {i.unreported_hosts.length === 1 ? "it" : "them"} online (the agent reports
            after its next walk), or exclude a decommissioned host, with the reason.</Text>
          {running && can("keys:destroy") && (
            <Group gap="xs" mt="xs">
              {i.unreported_hosts.map((host) => (
                <Button key={host} size="compact-xs" variant="default"
                        onClick={() => setExcluding({ kind: "host", holder: host, name: host })}>Exclude host {host}…</Button>
              ))}
            </Group>
          )}
        </Alert>
      )}
      <UnreadableFiles i={i} version={version} />
      <Holders i={i} onExclude={(h) => setExcluding({ kind: h.kind, holder: h.holder, name: h.name })} />
      {excluding && running && (
        <ExcludeForm key={`${excluding.kind}:${excluding.holder}`} k={k} version={version} h={excluding}
                     onDone={() => setExcluding(null)} />
      )}
      <RetirementSection k={k} version={version} r={i.retirement} kinds={i.kinds} onRetire={onRetire}
                         canRetire={!!v && v.state !== "active"} />
    </Stack>
  );
}

/** Files a walk could not read under this key: they hold no version of it, so they do not block the
 *  retirement, but the statement names each guard point and host with its count. */
function UnreadableFiles({ i, version }: { i: Inventory; version: number }) {
  const found = unreadableHolders(i.holders);
  if (found.length === 0) return null;
  const total = found.reduce((a, h) => a + h.unreadable, 0);
  return (
    <Alert variant="light" color="yellow" data-testid="unreadable-files"
           title={`${total.toLocaleString("en")} file${total === 1 ? "" : "s"} with no readable header of this key`}>
      <Stack gap={4}>
        <Text size="sm">Damaged, or another key's: no version of {i.key} decrypts them, so they hold nothing under
          v{version} and do not block its retirement. {i.retirement?.state === "complete" ? "The" : "A"} signed statement
          names each guard point and host below with its count; the agent's log names the first files.</Text>
        <Stack gap={0} component="ul" m={0} pl="md">
          {found.map((h) => (
            <Text component="li" size="sm" key={h.holder} style={{ overflowWrap: "anywhere" }}>
              <b>{h.name}</b>: {h.unreadable.toLocaleString("en")}</Text>
          ))}
        </Stack>
      </Stack>
    </Alert>
  );
}

/** What an exclusion names: a holder of the inventory, or a whole host. */
interface Excluded { kind: ExclusionKind; holder: string; name: string }

function Holders({ i, onExclude }: { i: Inventory; onExclude: (h: Holder) => void }) {
  const { can } = useAuth();
  const running = i.retirement?.state === "running";
  if (i.holders.length === 0) {
    return <EmptyState title="No holder">The server knows of nothing that holds data under this version.</EmptyState>;
  }
  return (
    <Stack gap="xs">
      <Title order={3} size="h6">Holders</Title>
      <Table.ScrollContainer minWidth={560}>
        <Table fz="sm" verticalSpacing={6} data-testid="inventory-holders">
          <Table.Thead><Table.Tr>
            <Table.Th>Holder</Table.Th><Table.Th>Kind</Table.Th><Table.Th ta="right">Count</Table.Th><Table.Th>State</Table.Th>
            <Table.Th>Reported</Table.Th>{running && can("keys:destroy") && <Table.Th><span className="sr-only">Actions</span></Table.Th>}
          </Table.Tr></Table.Thead>
          <Table.Tbody>
            {i.holders.map((h) => (
              <Table.Tr key={`${h.kind}:${h.holder}`} data-holder={h.holder} data-state={h.state}>
                <Table.Td>
                  <Text size="sm" fw={600} style={{ overflowWrap: "anywhere" }}>{h.name}</Text>
                  {h.host && <Text size="xs" c="dimmed">on {h.host}</Text>}
                  {(h.unreadable ?? 0) > 0 && (
                    <Text size="xs" c="yellow.8" data-testid="holder-unreadable">
                      {h.unreadable?.toLocaleString("en")} unreadable (no version of this key)</Text>
                  )}
                </Table.Td>
                <Table.Td>{kindLabel(h.kind)}</Table.Td>
                <Table.Td ta="right">{countText(h)}</Table.Td>
                <Table.Td><HolderStateBadge state={h.state} /></Table.Td>
                <Table.Td title={fmtTime(h.reported_at)} style={{ whiteSpace: "nowrap" }}>
                  {h.reported_at ? fmtRelative(h.reported_at) : <Text span size="sm" c="dimmed">—</Text>}</Table.Td>
                {running && can("keys:destroy") && (
                  <Table.Td>
                    {(h.state === "in_use" || h.state === "unreported") && (
                      <Button size="compact-xs" variant="default" onClick={() => onExclude(h)}
                              aria-label={`Exclude ${h.name}…`}>Exclude…</Button>
                    )}
                  </Table.Td>
                )}
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
    </Stack>
  );
}

/** Declares one holder clear of the version, with the reason (held, audited; the statement lists it). */
function ExcludeForm({ k, version, h, onDone }: { k: Key; version: number; h: Excluded; onDone: () => void }) {
  const [reason, setReason] = useState("");
  const [held, setHeld] = useState<string | null>(null);
  const refresh = useRetirementRefresh();
  const exclude = useMutation({
    mutationFn: () => retirementApi.exclude(k.id, version, { kind: h.kind, holder: h.holder, reason: reason.trim() }),
    onSuccess: (r) => {
      refresh();
      const waiting = heldDetail(r);
      if (waiting) { setHeld(waiting); return; }
      notifications.show({ color: "teal", title: "Holder excluded", message: `${h.name} no longer blocks the retirement of v${version}` });
      onDone();
    },
  });
  if (held) {
    return (
      <Alert color="blue" variant="light" title="Waiting for approval" data-testid="exclude-held">
        <Text size="sm">{held} {h.name} stays in the inventory until another person approves the exclusion.</Text>
        <Group gap="xs" mt="xs"><Anchor component={Link} to="/approvals" size="sm">Open approvals</Anchor>
          <Button size="compact-sm" variant="default" onClick={onDone}>Done</Button></Group>
      </Alert>
    );
  }
  return (
    <Paper withBorder radius="sm" p="sm">
      <form aria-label={`Exclude ${h.name}`} onSubmit={(e) => { e.preventDefault(); if (reason.trim()) exclude.mutate(); }}>
        <Stack gap="xs">
          <Text size="sm" fw={600}>Exclude {h.name} ({h.kind === "host" ? "every guard point and volume of the host" : kindLabel(h.kind)})</Text>
          <Text size="sm">Only for a holder known to hold nothing under v{version} any more — a decommissioned host, a
            client whose data is gone. The retirement then treats it as clear; the signed statement names it with your reason.</Text>
          <Textarea label="Reason" required value={reason} onChange={(e) => setReason(e.currentTarget.value)} autosize minRows={2}
                    maxRows={8} data-autofocus data-testid="exclude-reason"
                    error={exclude.isIdle || reason.trim() ? undefined : "Say why this holder holds nothing"} />
          <ErrorAlert error={exclude.error} title="Not excluded" />
          <Group justify="flex-end" gap="xs">
            <Button variant="default" onClick={onDone}>Cancel</Button>
            <Button type="submit" color="ink" loading={exclude.isPending} disabled={!reason.trim()}
                    data-testid="exclude-submit">Exclude holder</Button>
          </Group>
        </Stack>
      </form>
    </Paper>
  );
}


function RetirementSection({ k, version, r, kinds, onRetire, canRetire }: {
  k: Key; version: number; r: Retirement | null; kinds: Record<string, number>; onRetire: () => void; canRetire: boolean;
}) {
  const [confirmCancel, setConfirmCancel] = useState(false);
  const refresh = useRetirementRefresh();
  const cancel = useMutation({
    mutationFn: () => retirementApi.cancel(k.id, version),
    onSuccess: () => {
      setConfirmCancel(false);
      refresh();
      notifications.show({ color: "teal", title: "Retirement cancelled", message: `${k.name} v${version}: holders already moved stay moved` });
    },
  });
  const retireButton = (
    <GuardedButton perm="keys:destroy" mode="hide" variant="default" color="orange" onClick={onRetire} disabled={!canRetire}
                   data-testid="inventory-retire">Retire version…</GuardedButton>
  );
  if (!r) {
    return (
      <Stack gap="xs" data-testid="retirement">
        <Title order={3} size="h6">Retirement</Title>
        <Text size="sm" c="dimmed">Not retired. {canRetire ? "" : "The active version cannot be retired: rotate the key first."}</Text>
        <Group>{retireButton}</Group>
      </Stack>
    );
  }
  const pct = r.state === "complete" ? 100 : progressOf(r.initial, kinds);
  return (
    <Stack gap="xs" data-testid="retirement" data-state={r.state}>
      <Group gap="xs">
        <Title order={3} size="h6">Retirement</Title>
        <Badge color={RETIREMENT_COLOR[r.state] ?? "gray"} variant="light" radius="sm" style={{ overflow: "visible" }}>{r.state}</Badge>
      </Group>
      <Text size="sm">Asked by {r.requested_by ?? "—"} {r.requested_at ? `on ${fmtTime(r.requested_at)}` : ""}
        {r.contents ? " · file contents re-encrypted too" : " · headers re-wrapped"}</Text>
      {r.reason && <Text size="sm" c="dimmed" style={{ overflowWrap: "anywhere" }}>“{r.reason}”</Text>}
      {r.state !== "cancelled" && pct != null && (
        <Progress value={pct} size="md" radius="sm" animated={r.state === "running"} aria-label="Moved to the newest version" />
      )}
      {r.state === "running" && r.initial && (
        <Text size="xs" c="dimmed" data-testid="retirement-progress">
          {Object.entries(r.initial).filter(([, n]) => n > 0)
            .map(([kind, n]) => `${kindLabel(kind)}: ${(kinds[kind] ?? 0).toLocaleString("en")} of ${n.toLocaleString("en")} left`)
            .join(" · ") || "Nothing was in use when it began."}
        </Text>
      )}
      {r.state === "complete" && (
        <Alert color="teal" variant="light" title="Signed zero-use statement" data-testid="retirement-statement">
          <Text size="sm">Completed {fmtTime(r.completed_at)}. The statement that nothing uses v{version} is audit
            record{" "}
            {r.statement_seq != null
              ? <Anchor component={Link} to={`/audit?seq=${r.statement_seq}`} size="sm" data-testid="statement-link">#{r.statement_seq}</Anchor>
              : "(being chained)"}, signed in the HSM with the audit checkpoint key; the offline verifier checks it.
            The version can now be destroyed.</Text>
        </Alert>
      )}
      {r.state === "cancelled" && (
        <Text size="sm" c="dimmed">Cancelled {r.cancelled_by ? `by ${r.cancelled_by} ` : ""}{fmtTime(r.cancelled_at)}. Holders that had
          moved stay on the newest version.</Text>
      )}
      {r.state === "running" && (confirmCancel ? (
        <Alert color="orange" variant="light" title="Cancel the retirement?">
          <Text size="sm">The inventory stops being driven to zero and no statement is written. Nothing is undone: holders that
            moved stay on the newest version.</Text>
          <ErrorAlert error={cancel.error} title="Not cancelled" />
          <Group gap="xs" mt="xs">
            <Button size="compact-sm" variant="default" onClick={() => setConfirmCancel(false)}>Keep it running</Button>
            <Button size="compact-sm" color="red" loading={cancel.isPending} onClick={() => cancel.mutate()}
                    data-testid="cancel-retirement-confirm">Cancel retirement</Button>
          </Group>
        </Alert>
      ) : (
        <Group><GuardedButton perm="keys:destroy" mode="hide" variant="default" onClick={() => setConfirmCancel(true)}
                              data-testid="cancel-retirement">Cancel retirement</GuardedButton></Group>
      ))}
      {r.state === "cancelled" && <Group>{retireButton}</Group>}
    </Stack>
  );
}

/** Starts a retirement of one version (held under the two-person rule: 202 waits for approval). */
export function RetireDialog({ k, version, onClose, onStarted }: {
  k: Key; version: number | null; onClose: () => void; onStarted: (version: number) => void;
}) {
  const [reason, setReason] = useState("");
  const [contents, setContents] = useState(false);
  const [held, setHeld] = useState<string | null>(null);
  const shown = useLastVersion(version);
  const refresh = useRetirementRefresh();
  const retire = useMutation({
    mutationFn: (v: number) => retirementApi.retire(k.id, v, { reason: reason.trim(), contents }),
    onSuccess: (r, v) => {
      refresh();
      const waiting = heldDetail(r);
      if (waiting) { setHeld(waiting); return; }
      notifications.show({ color: "teal", title: "Retirement started", message: `${k.name} v${v}: holders are moving to v${k.current_version}` });
      close();
      onStarted(v);
    },
  });
  const close = () => { setReason(""); setContents(false); setHeld(null); retire.reset(); onClose(); };
  return (
    <Modal opened={version != null} onClose={close} title={`Retire ${k.name} v${shown}`} centered size="lg">
      {held ? (
        <Stack gap="sm" data-testid="retire-held">
          <Alert color="blue" variant="light" title="Waiting for approval">
            {held} The retirement begins once another person approves it; until then nothing moves.
          </Alert>
          <Group justify="flex-end">
            <Button variant="default" component={Link} to="/approvals" onClick={close}>Open approvals</Button>
            <Button color="ink" onClick={close}>Done</Button>
          </Group>
        </Stack>
      ) : (
        <form aria-label={`Retire ${k.name} v${shown}`}
              onSubmit={(e) => { e.preventDefault(); if (shown != null && reason.trim()) retire.mutate(shown); }}>
          <Stack gap="sm">
            <Text size="sm">Every holder of v{shown} is moved to the newest version, v{k.current_version}: hosts re-wrap guard-point
              file headers and reseal volumes, applications re-encrypt their data keys. Readers keep working throughout: v{shown} still
              decrypts until it is destroyed. When nothing uses it and every host has reported, the server writes a signed
              zero-use statement to the audit log; then v{shown} can be destroyed.</Text>
            <Textarea label="Reason" required value={reason} onChange={(e) => setReason(e.currentTarget.value)} autosize minRows={2}
                      maxRows={8} description="Recorded in the audit log and in the statement" data-autofocus data-testid="retire-reason" />
            <Checkbox label="Also re-encrypt file contents" checked={contents} onChange={(e) => setContents(e.currentTarget.checked)}
                      description="Guard points get new file keys and their files are rewritten, not only their headers re-wrapped: slower, and needed when the old version's file keys must not survive"
                      data-testid="retire-contents" />
            <Text size="sm" c="dimmed">Retiring may wait for a second person's approval.</Text>
            <ErrorAlert error={retire.error} title="Not retired" />
            <Group justify="flex-end">
              <Button variant="default" onClick={close}>Cancel</Button>
              <Button type="submit" color="ink" loading={retire.isPending} disabled={!reason.trim()}
                      data-testid="retire-submit">Retire v{shown}</Button>
            </Group>
          </Stack>
        </form>
      )}
    </Modal>
  );
}

/** Destroy refused (version_in_use): who still holds data under the version, and the two ways
 *  on — retire it first (nothing is lost), or shred on purpose (what they hold is lost). */
export function DestroyInUse({ k, error, version, shred, onInventory, onRetire, onShred }: {
  k: Key; error: VersionInUse; version: number | undefined; shred: boolean;
  onInventory: (version: number) => void; onRetire: (version: number) => void; onShred: () => void;
}) {
  const { can } = useAuth();
  // The versions in the way (destroying every version names each holder's), and which of
  // them a retirement can clear: the older ones.
  const named = [...new Set(error.holders.map((h) => h.version ?? version).filter((v): v is number => v != null))].sort((a, b) => a - b);
  const versions = named.length ? named : version != null ? [version] : [];
  const older = versions.filter((n) => { const v = k.versions.find((x) => x.version === n); return !!v && retirable(k, v); });
  const newest = versions.filter((n) => !older.includes(n));
  const shown = error.holders.slice(0, 8);
  return (
    <Alert color="red" variant="light" title={`${versions.length ? versions.map((n) => `v${n}`).join(", ") : "The key"} still in use`}
           data-testid="destroy-in-use">
      <Stack gap={6}>
        <Text size="sm">{error.detail}</Text>
        {shown.length > 0 && (
          <Stack gap={2} component="ul" m={0} pl="md" data-testid="destroy-holders">
            {shown.map((h) => (
              <Text component="li" size="sm" key={`${h.version}:${h.kind}:${h.holder}`} style={{ overflowWrap: "anywhere" }}>
                {versions.length > 1 && h.version != null ? `v${h.version} · ` : ""}{kindLabel(h.kind)} <b>{h.name}</b>
                {h.host ? ` on ${h.host}` : ""}: {countText(h)}{h.state !== "in_use" ? ` (${HOLDER_STATE[h.state]?.label ?? h.state})` : ""}
              </Text>
            ))}
            {error.holders.length > shown.length && <Text component="li" size="sm">and {error.holders.length - shown.length} more</Text>}
          </Stack>
        )}
        {shred ? (
          <Text size="sm" fw={600} data-testid="shred-warning">Shredding makes what these holders protect unreadable, for good.
            Type the key's name again to shred anyway.</Text>
        ) : (
          <>
            <Text size="sm" fw={500}>
              {older.length > 0 && <>Retire {older.map((n) => `v${n}`).join(", ")} first: a retirement moves every holder to
                the newest version and, once none is left, writes a signed statement; then destroy. </>}
              {newest.length > 0 && <>Rotate the key, then retire {newest.map((n) => `v${n}`).join(", ")} the same way. </>}
              Or shred, knowing what the holders protect is lost.
            </Text>
            <Group gap="xs">
              {older.map((n) => (
                <Group gap="xs" key={n}>
                  <Button size="compact-sm" variant="default" onClick={() => onInventory(n)}>Inventory of v{n}</Button>
                  {can("keys:destroy") && <Button size="compact-sm" variant="default" color="orange" onClick={() => onRetire(n)}
                                                  data-testid={`destroy-retire-v${n}`}>Retire v{n}…</Button>}
                </Group>
              ))}
              <Button size="compact-sm" variant="outline" color="red" onClick={onShred} data-testid="shred-anyway">Shred anyway…</Button>
            </Group>
          </>
        )}
      </Stack>
    </Alert>
  );
}
