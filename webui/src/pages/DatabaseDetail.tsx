// One database: the keys it may read (MariaDB key id → Strongroom key), what it last read,
// and the actions on it: grant a key, remove a grant, issue a new token, revoke it.
import {
  Alert, Anchor, Button, Group, Modal, Paper, Select, SimpleGrid, Stack, Table, Text, TextInput, Title,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { notifications } from "@mantine/notifications";
import { IconKey, IconPlus } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState, type ReactNode } from "react";
import { Link, useParams } from "react-router";
import { useAuth } from "../auth";
import { heldDetail } from "../approvals";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { PageHeader } from "../components/PageHeader";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import {
  DEFAULT_KEY_ID, databasesApi, dbq, keyIdError, nextKeyId, useDatabase, type Database, type DatabaseIssued, type Grant,
} from "../databases";
import { useKeys } from "../queries";
import { DatabaseStateBadge, TokenDialog } from "./Databases";

type Dialog = null | "grant" | "reissue" | "revoke";

export function DatabaseDetailPage() {
  const { name = "" } = useParams();
  const db = useDatabase(name);
  if (db.error) {
    return (
      <Stack>
        <Crumbs name={name} />
        <PageHeader title={name} />
        <ErrorAlert error={db.error} title="Database could not be loaded" />
      </Stack>
    );
  }
  if (db.isPending) return <Loading label="Loading database…" />;
  return <DatabaseView d={db.data} />;
}

function Crumbs({ name }: { name: string }) {
  return <Text size="sm"><Anchor component={Link} to="/databases" underline="always">Databases</Anchor> / {name}</Text>;
}

/** After a change: the lists, the keys' "Used by" panels and (a moment later, when the
 *  audit chainer has appended its record) the audit views. */
function useRefresh() {
  const qc = useQueryClient();
  return () => {
    void qc.invalidateQueries({ queryKey: dbq.all });
    void qc.invalidateQueries({ queryKey: dbq.consumersAll });
    for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
  };
}

function DatabaseView({ d }: { d: Database }) {
  const { can } = useAuth();
  const refresh = useRefresh();
  const [dialog, setDialog] = useState<Dialog>(null);
  const [removing, setRemoving] = useState<Grant | null>(null);
  const [issued, setIssued] = useState<DatabaseIssued | null>(null);
  const revoked = !!d.revoked_at;
  const manage = can("databases:manage") && !revoked;
  const reissue = useMutation({
    mutationFn: () => databasesApi.reissue(d.name),
    onSuccess: (r) => { refresh(); setDialog(null); setIssued(r); },
  });
  const revoke = useMutation({
    mutationFn: () => databasesApi.revoke(d.name),
    onSuccess: () => {
      refresh();
      setDialog(null);
      notifications.show({ color: "teal", title: "Database revoked", message: `${d.name}: its token is refused from its next read` });
    },
  });
  return (
    <Stack gap="md">
      <Crumbs name={d.name} />
      <PageHeader
        title={<Group gap="sm"><span data-testid="database-name">{d.name}</span><DatabaseStateBadge d={d} /></Group>}
        subtitle={d.description || "No description"}
        actions={!revoked && <>
          {/* The database reads the key itself: granting needs keys:export as well (the server checks both). */}
          {can("databases:manage") && (
            <GuardedButton perm="keys:export" color="ink" leftSection={<IconPlus size={16} />}
                           onClick={() => setDialog("grant")} data-testid="grant-key">Grant a key</GuardedButton>
          )}
          <GuardedButton perm="databases:manage" mode="hide" variant="default"
                         onClick={() => { reissue.reset(); setDialog("reissue"); }} data-testid="reissue-token">Issue a new token</GuardedButton>
          <GuardedButton perm="databases:manage" mode="hide" variant="outline" color="red"
                         onClick={() => { revoke.reset(); setDialog("revoke"); }} data-testid="revoke-database">Revoke</GuardedButton>
        </>} />
      {revoked && (
        <Alert color="red" variant="light" title={`Revoked ${fmtTime(d.revoked_at)}`} data-testid="database-revoked">
          Every read with its token is refused. A running MariaDB keeps the keys it holds in memory until it restarts; after
          that it cannot open its encrypted tables. To let it back in, connect it again under a new name and grant its keys.
        </Alert>
      )}
      <Paper withBorder radius="md" p="md">
        <Title order={2} size="h5" mb="sm">Properties</Title>
        <SimpleGrid cols={2} spacing={6} verticalSpacing={6} style={{ gridTemplateColumns: "120px minmax(0, 1fr)" }}>
          <Prop label="Kind">{d.kind === "mariadb" ? "MariaDB (hashicorp_key_management, Vault KV version 2)" : d.kind}</Prop>
          <Prop label="Connected">{fmtTime(d.created_at)} by {d.created_by}</Prop>
          <Prop label="Last read">{d.last_seen_at ? `${fmtTime(d.last_seen_at)} (${fmtRelative(d.last_seen_at)})`
            : "never: it has not read a key yet (is the plugin configured and MariaDB restarted?)"}</Prop>
          {revoked && <Prop label="Revoked">{fmtTime(d.revoked_at)}</Prop>}
        </SimpleGrid>
      </Paper>
      <Paper withBorder radius="md" p="md" component="section" aria-labelledby="grants-title">
        <Stack gap={0} mb="sm">
          <Title order={2} size="h5" id="grants-title">Keys it may read</Title>
          <Text size="xs" c="dimmed">Each grant maps a MariaDB key id to a Strongroom key. A rotation here is a new version
            there; MariaDB re-encrypts with it as innodb_encryption_rotate_key_age says.</Text>
        </Stack>
        <GrantsTable d={d} manage={manage} onRemove={(g) => setRemoving(g)} />
      </Paper>
      <GrantDialog d={d} opened={dialog === "grant"} onClose={() => setDialog(null)} />
      <RemoveGrantDialog d={d} grant={removing} onClose={() => setRemoving(null)} />
      <Modal opened={dialog === "reissue"} onClose={() => setDialog(null)} title={`Issue a new token for ${d.name}`} centered>
        <Stack gap="sm">
          <Text size="sm">The current token stops working at once: MariaDB keeps the keys it has in memory, but its next
            read (a rotation, a restart) is refused until its configuration holds the new token.</Text>
          <Text size="sm">The new token is shown once, with the configuration to paste.</Text>
          <ErrorAlert error={reissue.error} title="No new token issued" />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setDialog(null)}>Cancel</Button>
            <Button color="ink" loading={reissue.isPending} onClick={() => reissue.mutate()}
                    data-testid="reissue-token-confirm">Issue a new token</Button>
          </Group>
        </Stack>
      </Modal>
      <TypedConfirmDialog opened={dialog === "revoke"} onClose={() => setDialog(null)} title={`Revoke ${d.name}`}
                          phrase={d.name} actionLabel="Revoke database" busy={revoke.isPending} error={revoke.error}
                          onConfirm={() => revoke.mutate()}>
        <Text size="sm" fw={600} c="var(--sr-text-danger)">This cannot be undone.</Text>
        <Text size="sm">Its token is refused from its next read, on every replica, and its {d.grants.length} grant(s) stop
          working. MariaDB keeps what it holds in memory until it restarts; after a restart it cannot open its encrypted
          tables, redo log or temporary files. The keys themselves stay, with their audit trail.</Text>
      </TypedConfirmDialog>
      <TokenDialog issued={issued} onClose={() => setIssued(null)} reissued />
    </Stack>
  );
}

function Prop({ label, children }: { label: string; children: ReactNode }) {
  return <><Text size="sm" c="dimmed">{label}</Text><Text size="sm" component="div" style={{ overflowWrap: "anywhere" }}>{children}</Text></>;
}

function GrantsTable({ d, manage, onRemove }: { d: Database; manage: boolean; onRemove: (g: Grant) => void }) {
  if (d.grants.length === 0) {
    return (
      <EmptyState title="No key granted">
        It can read no key, so MariaDB cannot encrypt or open encrypted tables. Grant a key as key id {DEFAULT_KEY_ID}:
        MariaDB uses it unless a table or innodb_default_encryption_key_id names another.
      </EmptyState>
    );
  }
  const grants = [...d.grants].sort((a, b) => a.key_id - b.key_id);
  return (
    <Table.ScrollContainer minWidth={680}>
      <Table fz="sm" verticalSpacing={6} highlightOnHover data-testid="grants-table">
        <Table.Thead><Table.Tr>
          <Table.Th>Key id</Table.Th><Table.Th>Key</Table.Th><Table.Th>Last read</Table.Th><Table.Th>Version read</Table.Th>
          <Table.Th>Granted</Table.Th>{manage && <Table.Th><span className="sr-only">Remove</span></Table.Th>}
        </Table.Tr></Table.Thead>
        <Table.Tbody>
          {grants.map((g) => (
            <Table.Tr key={g.key_id} data-key-id={g.key_id}>
              <Table.Td><Text size="sm" ff="monospace" fw={600}>{g.key_id}</Text>
                {g.key_id === DEFAULT_KEY_ID && <Text size="xs" c="dimmed">MariaDB's default</Text>}</Table.Td>
              <Table.Td>
                <Anchor component={Link} to={`/keys/${encodeURIComponent(g.key_uuid)}`} size="sm" fw={600}>{g.key_name}</Anchor>
              </Table.Td>
              <Table.Td title={fmtTime(g.last_read_at)} style={{ whiteSpace: "nowrap" }}>
                {g.last_read_at ? fmtRelative(g.last_read_at) : <Text span size="sm" c="dimmed">never</Text>}</Table.Td>
              <Table.Td>{g.last_read_version != null ? `v${g.last_read_version}` : <Text span size="sm" c="dimmed">—</Text>}</Table.Td>
              <Table.Td title={fmtTime(g.granted_at)} style={{ whiteSpace: "nowrap" }}>
                {fmtRelative(g.granted_at)}<Text size="xs" c="dimmed">by {g.granted_by}</Text></Table.Td>
              {manage && <Table.Td>
                <Button size="compact-sm" variant="subtle" color="red" onClick={() => onRemove(g)}
                        aria-label={`Remove key id ${g.key_id} (${g.key_name}) from ${d.name}`}>Remove</Button>
              </Table.Td>}
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

/** A key (active AES keys, searched on the server by name) under a MariaDB key id. */
function GrantDialog({ d, opened, onClose }: { d: Database; opened: boolean; onClose: () => void }) {
  const [keyRef, setKeyRef] = useState<string | null>(null);
  const [search, setSearch] = useState("");
  const [debounced] = useDebouncedValue(search, 250);
  // null until typed in: the smallest id the database does not use yet (1 when it has none).
  const [keyIdText, setKeyIdText] = useState<string | null>(null);
  const [held, setHeld] = useState<string | null>(null);
  const keys = useKeys({ q: debounced.trim() || undefined, state: "active", limit: 50, offset: 0, sort: "name" }, opened);
  // What the server grants (keyserver/core/integrations.py): an Active AES key whose policy
  // lets its material leave, since the database reads the key itself.
  const aes = (keys.data?.items ?? []).filter((k) => k.algorithm.toUpperCase() === "AES" && k.exportable);
  const chosen = aes.find((k) => k.id === keyRef);
  const typedId = keyIdText ?? String(nextKeyId(d.grants));
  const idError = keyIdError(typedId, d.grants.map((g) => g.key_id));
  const refresh = useRefresh();
  const grant = useMutation({
    mutationFn: () => databasesApi.grant(d.name, { key: keyRef ?? "", key_id: Number(typedId.trim()) }),
    onSuccess: (r) => {
      refresh();
      const waiting = heldDetail(r);
      if (waiting) { setHeld(waiting); return; }
      notifications.show({ color: "teal", title: "Key granted",
                           message: `${d.name} reads ${chosen?.name ?? "the key"} as key id ${typedId.trim()}` });
      close();
    },
  });
  const close = () => { setKeyRef(null); setSearch(""); setKeyIdText(null); setHeld(null); grant.reset(); onClose(); };
  const invalid = !keyRef || !!idError;
  return (
    <Modal opened={opened} onClose={close} title={`Grant a key to ${d.name}`} centered size="lg">
      {held ? (
        <Stack gap="sm" data-testid="grant-held">
          <Alert color="blue" variant="light" title="Waiting for approval">
            {held} The grant takes effect once another person approves it; until then {d.name} cannot read the key.
          </Alert>
          <Group justify="flex-end">
            <Button variant="default" component={Link} to="/approvals" onClick={close}>Open approvals</Button>
            <Button color="ink" onClick={close}>Done</Button>
          </Group>
        </Stack>
      ) : (
        <form aria-label={`Grant a key to ${d.name}`} onSubmit={(e) => { e.preventDefault(); if (!invalid) grant.mutate(); }}>
          <Stack gap="sm">
            <Select label="Key" required searchable placeholder="Type to search keys by name"
                    leftSection={<IconKey size={14} />} data={aes.map((k) => ({ value: k.id, label: k.name }))}
                    value={keyRef} onChange={setKeyRef} searchValue={search} onSearchChange={setSearch}
                    nothingFoundMessage={keys.isFetching ? "Searching…" : "No active, exportable AES key by that name"}
                    description={chosen ? `${chosen.algorithm}-${chosen.length_bits} · current version v${chosen.current_version}${chosen.owner ? ` · owner ${chosen.owner}` : ""}`
                      : "Active AES keys whose policy lets the material leave: the database reads the key itself"}
                    error={keys.error ? "Keys could not be loaded: reopen this dialog to try again" : undefined}
                    comboboxProps={{ withinPortal: true }} data-testid="grant-key-select" />
            <TextInput label="MariaDB key id" required inputMode="numeric" autoComplete="off" value={typedId}
                       onChange={(e) => setKeyIdText(e.currentTarget.value)} error={idError} w={260}
                       description="1 is MariaDB's default key (innodb_default_encryption_key_id = 1); a table uses another with ENCRYPTION_KEY_ID = n"
                       data-testid="grant-key-id" />
            <Text size="sm" c="dimmed">From its next read, {d.name} reads every version of this key; a rotation here is a new
              version there. Granting may wait for a second person's approval.</Text>
            <ErrorAlert error={grant.error} title="Key not granted" />
            <Group justify="flex-end">
              <Button variant="default" onClick={close}>Cancel</Button>
              <Button type="submit" color="ink" loading={grant.isPending} disabled={invalid}
                      data-testid="grant-key-submit">Grant key</Button>
            </Group>
          </Stack>
        </form>
      )}
    </Modal>
  );
}

function RemoveGrantDialog({ d, grant, onClose }: { d: Database; grant: Grant | null; onClose: () => void }) {
  const refresh = useRefresh();
  const remove = useMutation({
    mutationFn: (g: Grant) => databasesApi.removeGrant(d.name, g.key_id),
    onSuccess: (_, g) => {
      refresh();
      notifications.show({ color: "teal", title: "Grant removed", message: `${d.name} can no longer read ${g.key_name} (key id ${g.key_id})` });
      close();
    },
  });
  const close = () => { remove.reset(); onClose(); };
  return (
    <Modal opened={!!grant} onClose={close} title={`Remove key id ${grant?.key_id ?? ""} from ${d.name}`} centered>
      <Stack gap="sm">
        <Text size="sm">{d.name} can no longer read <b>{grant?.key_name}</b> as key id {grant?.key_id}. MariaDB keeps the
          key in memory until it restarts; after that, tables encrypted with key id {grant?.key_id} cannot be opened
          {grant?.key_id === DEFAULT_KEY_ID ? ", and with key id 1 that is usually all of them" : ""}.</Text>
        <Text size="sm">The key itself stays. Granting it again under the same id gives the access back.</Text>
        <ErrorAlert error={remove.error} title="Grant not removed" />
        <Group justify="flex-end">
          <Button variant="default" onClick={close}>Cancel</Button>
          <Button color="red" loading={remove.isPending} onClick={() => grant && remove.mutate(grant)}
                  data-testid="remove-grant-confirm">Remove grant</Button>
        </Group>
      </Stack>
    </Modal>
  );
}
