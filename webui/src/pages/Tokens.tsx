import { Badge, Button, Group, Modal, MultiSelect, NumberInput, Paper, Stack, Switch, Table, Text, TextInput, Tooltip } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconPlus } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { api, call, type Token } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { SecretOnce } from "../components/SecretOnce";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { LIMITS, lengthError, tooLong } from "../textLimits";
import { qk } from "../queries";

function tokenStatus(t: Token): { label: string; color: string } {
  if (t.revoked_at) return { label: "revoked", color: "red" };
  if (t.expires_at && new Date(t.expires_at).getTime() < Date.now()) return { label: "expired", color: "gray" };
  return { label: "active", color: "teal" };
}

function Scopes({ scopes }: { scopes: string[] }) {
  const shown = scopes.length > 5 ? scopes.slice(0, 4) : scopes;
  return (
    <Group gap={3}>
      {shown.map((s) => <Badge key={s} size="xs" variant="outline" color="gray" radius="sm">{s}</Badge>)}
      {shown.length < scopes.length && (
        <Tooltip label={scopes.slice(4).join(", ")} multiline w={260} withArrow>
          <Badge size="xs" variant="light" color="gray" radius="sm" tabIndex={0}>+{scopes.length - 4} more</Badge>
        </Tooltip>
      )}
    </Group>
  );
}

export function TokensPage() {
  const { can } = useAuth();
  const qc = useQueryClient();
  const [allUsers, setAllUsers] = useState(false);
  const tokens = useQuery({
    queryKey: qk.tokens(allUsers),
    queryFn: () => call(api.GET("/api/v1/tokens", { params: { query: { all_users: allUsers } } })),
  });
  const [creating, setCreating] = useState(false);
  const [secret, setSecret] = useState<string | null>(null);
  const [revoking, setRevoking] = useState<Token | null>(null);
  const revoke = useMutation({
    mutationFn: (t: Token) => call(api.DELETE("/api/v1/tokens/{token_id}", { params: { path: { token_id: t.id } } })),
    onSuccess: (t) => {
      void qc.invalidateQueries({ queryKey: qk.tokensAll });
      notifications.show({ color: "teal", title: "Token revoked", message: `${t.name} (${t.prefix}…) no longer works` });
      setRevoking(null);
    },
  });

  return (
    <Stack gap="md">
      <PageHeader title="API tokens" subtitle="For automation: scoped, revocable, shown once. Scopes can only narrow your role."
        actions={<Button color="ink" leftSection={<IconPlus size={16} />} onClick={() => setCreating(true)}
                         data-testid="create-token">Create token</Button>} />
      {can("tokens:all") && (
        <Switch label="Show every user's tokens" checked={allUsers} onChange={(e) => setAllUsers(e.currentTarget.checked)} />
      )}
      <Paper withBorder radius="md">
        {tokens.error ? <ErrorAlert error={tokens.error} /> : tokens.isPending ? <Loading /> : tokens.data.length === 0 ? (
          <EmptyState title="No API tokens">Create one to call the API from a script, e.g. to rotate keys.</EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={900}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="tokens-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Name</Table.Th><Table.Th>Owner</Table.Th><Table.Th>Scopes</Table.Th><Table.Th w={90}>Status</Table.Th>
                <Table.Th style={{ whiteSpace: "nowrap" }}>Last used</Table.Th><Table.Th>Expires</Table.Th><Table.Th />
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {tokens.data.map((t) => {
                  const st = tokenStatus(t);
                  return (
                    <Table.Tr key={t.id}>
                      <Table.Td><Text size="sm" fw={600}>{t.name}</Text><Text size="xs" c="dimmed" ff="monospace">{t.prefix}…</Text></Table.Td>
                      <Table.Td style={{ whiteSpace: "nowrap" }}>{t.owner}</Table.Td>
                      <Table.Td><Scopes scopes={t.scopes} /></Table.Td>
                      <Table.Td><Badge color={st.color} variant="light" radius="sm" style={{ overflow: "visible" }}>{st.label}</Badge></Table.Td>
                      <Table.Td title={fmtTime(t.last_used_at)} style={{ whiteSpace: "nowrap" }}>{t.last_used_at ? fmtRelative(t.last_used_at) : "never"}</Table.Td>
                      <Table.Td title={fmtTime(t.expires_at)} style={{ whiteSpace: "nowrap" }}>{t.expires_at ? fmtRelative(t.expires_at) : "never"}</Table.Td>
                      <Table.Td>{!t.revoked_at && (
                        <Button size="compact-sm" variant="subtle" color="red" onClick={() => setRevoking(t)}
                                aria-label={`Revoke token ${t.name}`}>Revoke</Button>)}</Table.Td>
                    </Table.Tr>
                  );
                })}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
      <CreateTokenDialog opened={creating} onClose={() => setCreating(false)} onCreated={setSecret} />
      <SecretOnce opened={!!secret} title="API token created" secret={secret} label="Token"
                  note={`Use it as: Authorization: Bearer <token>`} onClose={() => setSecret(null)} />
      <Modal opened={!!revoking} onClose={() => setRevoking(null)} title={`Revoke ${revoking?.name}`} centered>
        <Stack gap="sm">
          <Text size="sm">Every request with this token is refused from now on. This cannot be undone.</Text>
          <ErrorAlert error={revoke.error} />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setRevoking(null)}>Cancel</Button>
            <Button color="red" loading={revoke.isPending} onClick={() => revoking && revoke.mutate(revoking)}>Revoke token</Button>
          </Group>
        </Stack>
      </Modal>
    </Stack>
  );
}

function CreateTokenDialog({ opened, onClose, onCreated }: { opened: boolean; onClose: () => void; onCreated: (s: string) => void }) {
  const { me } = useAuth();
  const qc = useQueryClient();
  const [name, setName] = useState("");
  const [scopes, setScopes] = useState<string[]>([]);
  const [days, setDays] = useState<number | string>(90);
  const create = useMutation({
    mutationFn: () => call(api.POST("/api/v1/tokens", { body: {
      name: name.trim(), scopes: scopes.length ? scopes : null, expires_in_days: Number(days) || 90,
    } })),
    onSuccess: (r) => { void qc.invalidateQueries({ queryKey: qk.tokensAll }); onCreated(r.secret); close(); },
  });
  const close = () => { setName(""); setScopes([]); setDays(90); create.reset(); onClose(); };
  // Scopes can only narrow the owner's role: offer exactly the owner's permissions.
  const available = me?.permissions ?? [];
  const nameError = lengthError(name.trim(), LIMITS.tokenName, create.error, "name");
  const invalid = !name.trim() || !!tooLong(name.trim(), LIMITS.tokenName);
  return (
    <Modal opened={opened} onClose={close} title="Create API token" centered>
      <form onSubmit={(e) => { e.preventDefault(); if (!invalid) create.mutate(); }} aria-label="Create API token">
        <Stack gap="sm">
          <TextInput label="Name" required data-autofocus placeholder="rotation-bot" value={name} error={nameError}
                     onChange={(e) => setName(e.currentTarget.value)} />
          <MultiSelect label="Scopes" description="Leave empty for all of your role's permissions" data={available}
                       value={scopes} onChange={setScopes} searchable clearable placeholder="e.g. keys:read, keys:rotate" />
          <NumberInput label="Expires after (days)" min={1} max={3650} allowDecimal={false} value={days} onChange={setDays} w={200} />
          <ErrorAlert error={create.error} title="Token not created" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={invalid}>Create token</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
