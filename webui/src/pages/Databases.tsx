// Databases that keep their encryption keys in Strongroom: MariaDB reads them over the
// Vault KV version 2 API with a token of its own, and only the keys granted to it
// (docs/integrations.md). Here people connect one, see what it reads, and cut it off.
import {
  Alert, Anchor, Badge, Button, Center, Code, Group, List, Modal, Paper, Stack, Table, Text, TextInput, Textarea,
} from "@mantine/core";
import { IconAlertTriangle, IconPlus } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { PageHeader } from "../components/PageHeader";
import { CopyValue, EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import {
  databaseState, dbPath, databasesApi, dbq, useDatabases, type Database, type DatabaseIssued, type DatabaseState,
} from "../databases";
import { LIMITS, lengthError, tooLong } from "../textLimits";

// As the server checks it (keyserver/core/databases.py): the name is in the token's
// audit records and in the URL MariaDB is configured with.
const DB_NAME = /^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$/;
const DB_NAME_RULE = "Lower-case letters, digits, dots, hyphens and underscores, starting and ending with a letter or digit";

const STATE_COLOR: Record<DatabaseState, string> = { active: "teal", revoked: "red" };

export function DatabaseStateBadge({ d }: { d: Pick<Database, "revoked_at"> }) {
  const st = databaseState(d);
  return <Badge color={STATE_COLOR[st]} variant="light" radius="sm" data-state={st} style={{ overflow: "visible" }}>{st}</Badge>;
}

export function DatabasesPage() {
  const dbs = useDatabases();
  const [connecting, setConnecting] = useState(false);
  const [issued, setIssued] = useState<DatabaseIssued | null>(null);
  const data = dbs.data;
  return (
    <Stack gap="md">
      <PageHeader title="Databases"
        subtitle="Databases that read their encryption keys from Strongroom (MariaDB's hashicorp_key_management plugin, over the Vault KV version 2 API). Each has its own token and reads only the keys granted to it; every read is audited."
        actions={<GuardedButton perm="databases:manage" mode="hide" color="ink" leftSection={<IconPlus size={16} />}
                                onClick={() => setConnecting(true)} data-testid="connect-database">Connect a database</GuardedButton>} />
      <Paper withBorder radius="md">
        {dbs.error ? <ErrorAlert error={dbs.error} title="Databases could not be loaded" />
          : dbs.isPending ? <Loading label="Loading databases…" />
          : data?.total === 0 ? <NoDatabasesYet onConnect={() => setConnecting(true)} />
          : <DatabasesTable dbs={data?.items ?? []} />}
      </Paper>
      {data && data.total > 0 && (
        <Text size="sm" c="dimmed" data-testid="databases-total">
          {data.total} database{data.total === 1 ? "" : "s"}
          {" · "}revoked ones stay listed, with their name, for the audit trail
        </Text>
      )}
      <ConnectDialog opened={connecting} onClose={() => setConnecting(false)}
                     onConnected={(i) => { setConnecting(false); setIssued(i); }} />
      <TokenDialog issued={issued} onClose={() => setIssued(null)} />
    </Stack>
  );
}

function NoDatabasesYet({ onConnect }: { onConnect: () => void }) {
  const { can } = useAuth();
  return (
    <Stack gap="xs" py="md" data-testid="no-databases">
      <EmptyState title="No database connected yet">
        Connecting a database gives it a token and the configuration for MariaDB's key management plugin. Then grant it
        a key as MariaDB's key id 1: it encrypts its tables, redo log and temporary files with that key from its next
        restart, and every read is in the audit log.
      </EmptyState>
      <Center>
        {can("databases:manage")
          ? <Button color="ink" leftSection={<IconPlus size={16} />} onClick={onConnect}>Connect the first database</Button>
          : <Text size="sm" c="dimmed">Connecting one needs the databases:manage permission (key officers and administrators).</Text>}
      </Center>
    </Stack>
  );
}

function DatabasesTable({ dbs }: { dbs: Database[] }) {
  return (
    <Table.ScrollContainer minWidth={760}>
      <Table highlightOnHover fz="sm" verticalSpacing={8} data-testid="databases-table">
        <Table.Thead><Table.Tr>
          <Table.Th>Name</Table.Th><Table.Th>Kind</Table.Th><Table.Th>State</Table.Th><Table.Th>Keys granted</Table.Th>
          <Table.Th>Last read</Table.Th><Table.Th>Connected</Table.Th>
        </Table.Tr></Table.Thead>
        <Table.Tbody>
          {dbs.map((d) => (
            <Table.Tr key={d.id} data-database={d.name}>
              <Table.Td>
                <Anchor component={Link} to={dbPath(d.name)} fw={600} size="sm" ff="monospace">{d.name}</Anchor>
                {d.description && <Text size="xs" c="dimmed" lineClamp={1}>{d.description}</Text>}
              </Table.Td>
              <Table.Td>{d.kind === "mariadb" ? "MariaDB" : d.kind}</Table.Td>
              <Table.Td style={{ minWidth: 90 }} title={d.revoked_at ? `revoked ${fmtTime(d.revoked_at)}` : undefined}>
                <DatabaseStateBadge d={d} /></Table.Td>
              <Table.Td data-testid="grants-count">
                {d.grants.length === 0 ? <Text span size="sm" c="var(--sr-text-warning)">none: it can read no key</Text>
                  : d.grants.length}
              </Table.Td>
              <Table.Td title={fmtTime(d.last_seen_at)} style={{ whiteSpace: "nowrap" }}>
                {d.last_seen_at ? fmtRelative(d.last_seen_at) : <Text span size="sm" c="dimmed">never</Text>}
              </Table.Td>
              <Table.Td title={fmtTime(d.created_at)} style={{ whiteSpace: "nowrap" }}>
                {fmtRelative(d.created_at)}<Text size="xs" c="dimmed">by {d.created_by}</Text>
              </Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

function ConnectDialog({ opened, onClose, onConnected }: {
  opened: boolean; onClose: () => void; onConnected: (i: DatabaseIssued) => void;
}) {
  const qc = useQueryClient();
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const create = useMutation({
    mutationFn: () => databasesApi.create({ name: name.trim(), description }),
    onSuccess: (r) => { void qc.invalidateQueries({ queryKey: dbq.all }); reset(); onConnected(r); },
  });
  const reset = () => { setName(""); setDescription(""); create.reset(); };
  const close = () => { reset(); onClose(); };
  const nameError = lengthError(name.trim(), LIMITS.databaseName, create.error, "name")
    ?? (name.trim() && !DB_NAME.test(name.trim()) ? DB_NAME_RULE : null);
  const descriptionError = lengthError(description, LIMITS.databaseDescription, create.error, "description");
  const invalid = !name.trim() || !!nameError || !!tooLong(description, LIMITS.databaseDescription);
  return (
    <Modal opened={opened} onClose={close} title="Connect a database" centered size="lg">
      <form aria-label="Connect a database" onSubmit={(e) => { e.preventDefault(); if (!invalid) create.mutate(); }}>
        <Stack gap="sm">
          <TextInput label="Name" required data-autofocus placeholder="payments-db-01"
                     description="How the audit log and the key pages name it; also part of the token's identity. It cannot be changed."
                     value={name} error={nameError} onChange={(e) => setName(e.currentTarget.value)} />
          <Textarea label="Description" description="Optional: where it runs, who answers for it" autosize minRows={2} maxRows={8}
                    value={description} error={descriptionError} onChange={(e) => setDescription(e.currentTarget.value)} />
          <Text size="sm" c="dimmed">The next screen shows the database's token once, with the ready configuration for MariaDB.
            It reads no key until you grant it one.</Text>
          <ErrorAlert error={create.error} title="Database not connected" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={invalid}
                    data-testid="connect-database-submit">Connect</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

/** Where the configuration tells MariaDB to find the key server's CA, if it says. */
export function caFileOf(config: string): string | null {
  return /^\s*hashicorp-key-management-vault-ca\s*=\s*(\S+)\s*$/m.exec(config)?.[1] ?? null;
}

/** The token shown once (after connecting or re-issuing), with the Vault URL and the my.cnf
 *  snippet, and what to do on the database's host. Dismissed only by its own button. */
export function TokenDialog({ issued, onClose, reissued = false }: {
  issued: DatabaseIssued | null; onClose: () => void; reissued?: boolean;
}) {
  const name = issued?.database.name ?? "";
  const noGrants = (issued?.database.grants.length ?? 0) === 0;
  const caPath = issued ? caFileOf(issued.config) : null;
  return (
    <Modal opened={!!issued} onClose={onClose} title={reissued ? `New token for ${name}` : `${name} connected`} centered size="xl"
           closeOnClickOutside={false} closeOnEscape={false} withCloseButton={false}>
      {issued && (
        <Stack gap="sm" data-testid="database-token">
          <Alert color="orange" variant="light" icon={<IconAlertTriangle size={18} />} title="The token is shown this once">
            The server keeps only a hash of it. Copy it (or the configuration below, which holds it) now; if it is lost,
            issue a new one from the database's page.{reissued && " The previous token stopped working when this one was made."}
          </Alert>
          <Stack gap={4}>
            <Text size="sm" fw={600}>Token</Text>
            <Group gap="xs" wrap="nowrap">
              <Code block data-testid="database-token-value"
                    style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}>{issued.token}</Code>
              <CopyValue value={issued.token} label="Copy the token" />
            </Group>
          </Stack>
          <Stack gap={4}>
            <Text size="sm" fw={600}>Vault URL</Text>
            <Group gap="xs" wrap="nowrap">
              <Code block style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}
                    data-testid="database-vault-url">{issued.vault_url}</Code>
              <CopyValue value={issued.vault_url} label="Copy the Vault URL" />
            </Group>
          </Stack>
          <Stack gap={4}>
            <Group justify="space-between" wrap="nowrap">
              <Text size="sm" fw={600} id="db-config-label">MariaDB configuration</Text>
              <CopyValue value={issued.config} label="Copy the MariaDB configuration" />
            </Group>
            {/* Scrolls inside its own box: a long line never widens the dialog on a phone. */}
            <Code block tabIndex={0} aria-labelledby="db-config-label" fz="xs" data-testid="database-config"
                  style={{ overflowX: "auto", maxWidth: "100%" }}>{issued.config}</Code>
          </Stack>
          <Stack gap={4}>
            <Text size="sm" fw={600}>What to do next, on the database's host</Text>
            <List type="ordered" size="sm" spacing={4}>
              <List.Item>Install the plugin: <Code>apt-get install mariadb-plugin-hashicorp-key-management</Code></List.Item>
              <List.Item>Save the configuration as <Code>/etc/mysql/mariadb.conf.d/90-strongroom.cnf</Code>, readable only
                by root and the mysql group (<Code>chmod 640</Code>): it holds the token.</List.Item>
              <List.Item>Save this server's CA certificate (<Anchor href="/ca.pem" download="strongroom-ca.pem" size="sm">download
                it</Anchor>) {caPath ? <>as <Code>{caPath}</Code>, where the configuration looks for it</>
                  : "where the configuration's hashicorp-key-management-vault-ca looks for it"}.</List.Item>
              {noGrants && <List.Item>Grant the database a key as key id 1, MariaDB's default, on its page here.</List.Item>}
              <List.Item>Restart MariaDB (<Code>systemctl restart mariadb</Code>), then
                check <Code>SELECT * FROM information_schema.INNODB_TABLESPACES_ENCRYPTION</Code>.</List.Item>
            </List>
          </Stack>
          <Group justify="flex-end" gap="xs">
            {!reissued && <Button variant="default" component={Link} to={dbPath(name)} onClick={onClose}>Open its page</Button>}
            <Button color="ink" onClick={onClose} data-testid="database-token-done">I have stored the token</Button>
          </Group>
        </Stack>
      )}
    </Modal>
  );
}
