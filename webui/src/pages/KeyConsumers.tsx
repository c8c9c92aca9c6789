// A key's "Used by": the databases granted it (with the MariaDB key id they read it as) and
// the KMIP clients that use it, each linked to where it is managed.
import { Anchor, Badge, Group, Paper, Table, Text, Title } from "@mantine/core";
import { Link } from "react-router";
import type { Key } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { dbPath, useKeyConsumers, type Consumer } from "../databases";

const KIND: Record<Consumer["kind"], { label: string; color: string }> = {
  database: { label: "database", color: "blue" },
  "kmip-client": { label: "KMIP client", color: "grape" },
};

/** "2 databases · 1 KMIP client" */
export function countOf(items: Consumer[]): string {
  const dbs = items.filter((c) => c.kind === "database").length;
  const clients = items.length - dbs;
  const parts = [];
  if (dbs) parts.push(`${dbs} database${dbs === 1 ? "" : "s"}`);
  if (clients) parts.push(`${clients} KMIP client${clients === 1 ? "" : "s"}`);
  return parts.join(" · ");
}

function ConsumerName({ c }: { c: Consumer }) {
  const { can } = useAuth();
  const name = <Text span size="sm" fw={600} ff="monospace">{c.name}</Text>;
  if (c.kind === "database" && can("databases:read")) {
    return <Anchor component={Link} to={dbPath(c.name)} size="sm" fw={600} ff="monospace">{c.name}</Anchor>;
  }
  if (c.kind === "kmip-client" && can("kmip:clients")) {
    return <Anchor component={Link} to="/kmip-clients" size="sm" fw={600} ff="monospace">{c.name}</Anchor>;
  }
  return name;
}

export function KeyConsumersPanel({ k }: { k: Key }) {
  const consumers = useKeyConsumers(k.id);
  const items = consumers.data?.items ?? [];
  return (
    <Paper withBorder radius="md" p="md" component="section" aria-labelledby="key-consumers-title" data-testid="key-consumers">
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h5" id="key-consumers-title">Used by</Title>
        {items.length > 0 && <Text size="xs" c="dimmed" data-testid="key-consumers-count">{countOf(items)}</Text>}
      </Group>
      {consumers.error ? <ErrorAlert error={consumers.error} title="What uses this key could not be loaded" />
        : consumers.isPending ? <Loading label="Loading what uses this key…" />
        : items.length === 0 ? (
          <EmptyState title="No database or application uses this key">
            A database reads it once it is granted on the database's page (Databases → a database → Grant a key, as a
            MariaDB key id). A KMIP client or PKCS#11 application uses the keys of its KMIP group and those granted to
            it (KMIP access, below). Hosts receive it through their group tag, shown under Properties.
          </EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={560}>
            <Table fz="sm" verticalSpacing={6} data-testid="key-consumers-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Name</Table.Th><Table.Th>Kind</Table.Th><Table.Th>How</Table.Th><Table.Th>Last used</Table.Th>
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {items.map((c) => (
                  <Table.Tr key={`${c.kind}:${c.name}:${c.detail}`} data-consumer={c.name}>
                    <Table.Td><ConsumerName c={c} /></Table.Td>
                    <Table.Td><Badge color={KIND[c.kind]?.color ?? "gray"} variant="light" radius="sm"
                                     style={{ overflow: "visible" }}>{KIND[c.kind]?.label ?? c.kind}</Badge></Table.Td>
                    <Table.Td>{c.detail || <Text span size="sm" c="dimmed">—</Text>}</Table.Td>
                    <Table.Td title={fmtTime(c.last_used_at)} style={{ whiteSpace: "nowrap" }}>
                      {c.last_used_at ? fmtRelative(c.last_used_at) : <Text span size="sm" c="dimmed">never</Text>}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
    </Paper>
  );
}
