// A key's KMIP access: the group whose clients see it, and the grants that let other clients
// or groups reach it (docs/kmip.md "Tenancy"). The group is changed in "Edit details".
import { Anchor, Button, Group, Paper, Text, Title } from "@mantine/core";
import { Link } from "react-router";
import type { Key } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { Loading } from "../components/bits";
import { kmipPath, useKmipGrants, useKmipGroups } from "../kmip";
import { GrantsTable } from "./KmipAccess";

export function KeyKmipPanel({ k, onEdit }: { k: Key; onEdit: () => void }) {
  const { can } = useAuth();
  const group = k.kmip_group ?? null;
  const grants = useKmipGrants({ key: k.id });
  // Grants on the key's whole group reach it too: who may use it is both lists.
  const groupGrants = useKmipGrants({ group: group ?? "" }, !!group);
  const groups = useKmipGroups(!!group);
  const clients = groups.data?.find((g) => g.name === group)?.clients ?? [];
  const viaGroup = group ? (groupGrants.data ?? []).filter((g) => g.target_kind === "group" && g.target === group) : [];
  const items = [...(grants.data ?? []).filter((g) => g.target_kind === "key"), ...viaGroup];
  const error = grants.error ?? groupGrants.error;
  const pending = grants.isPending || (!!group && groupGrants.isPending);
  return (
    <Paper withBorder radius="md" p="md" component="section" aria-labelledby="key-kmip-title" data-testid="key-kmip">
      <Group justify="space-between" mb="sm" wrap="wrap" gap="xs">
        <Title order={2} size="h5" id="key-kmip-title">KMIP access</Title>
        <Group gap="xs">
          {can("keys:update") && (
            <Button size="compact-sm" variant="default" onClick={onEdit} data-testid="key-kmip-group-edit">Change group</Button>
          )}
          {can("kmip:clients") && (
            <Button size="compact-sm" variant="default" component={Link} to={kmipPath("grants", { grant_key: k.name })}
                    data-testid="key-kmip-grant">Grant access</Button>
          )}
        </Group>
      </Group>
      <Text size="sm" data-testid="key-kmip-group">
        {group ? <>KMIP group <Text span ff="monospace" fw={600}>{group}</Text>: {groups.isPending ? "its clients see it."
          : clients.length ? `its clients (${clients.join(", ")}) see it.` : "no client is in this group yet."}</>
          : "No KMIP group: no KMIP client sees this key except through a grant."}
      </Text>
      <Text size="xs" c="dimmed" mt={4} mb="sm">A grant gives a client or a group rights on this key (every version);
        it never adds to what a client's role and key export setting allow.</Text>
      {error ? <ErrorAlert error={error} title="Grants on this key could not be loaded" />
        : pending ? <Loading label="Loading grants…" />
        : items.length === 0 ? <Text size="sm" c="dimmed" data-testid="key-kmip-no-grants">No grant on this key{group ? " or its group" : ""}.</Text>
        : <GrantsTable grants={items} showTarget={viaGroup.length > 0} />}
      {can("kmip:clients") && items.length > 0 && (
        <Anchor component={Link} to={kmipPath("grants")} size="sm" mt="xs" display="inline-block">Manage grants</Anchor>
      )}
    </Paper>
  );
}
