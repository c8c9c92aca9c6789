import { Badge, Button, Group, Menu, Modal, Paper, Select, Stack, Table, Text, TextInput } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconDots, IconPlus } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { ROLES, api, call, type Role, type User } from "../api/client";
import { heldDetail } from "../approvals";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { SecretOnce } from "../components/SecretOnce";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";
import { LIMITS, lengthError, tooLong } from "../textLimits";
import { qk } from "../queries";

const ROLE_HELP: Record<Role, string> = {
  admin: "everything, including users and the KEK",
  "key-officer": "create, change, revoke and destroy keys; read and verify audit",
  operator: "read and rotate keys; use data keys; take keys only wrapped",
  auditor: "read everything, change nothing",
  "storage-admin": "hosts, enrollment and guard points; no key material",
  "kmip-client": "a program's identity: use, export and retire keys; administer nothing",
};

export function UsersPage() {
  const { can, me } = useAuth();
  const qc = useQueryClient();
  const users = useQuery({ queryKey: qk.users, queryFn: () => call(api.GET("/api/v1/users")) });
  const [creating, setCreating] = useState(false);
  const [secret, setSecret] = useState<{ user: string; otp: string } | null>(null);
  const [disabling, setDisabling] = useState<User | null>(null);
  // A role change or a password reset is never one click: the person confirms by typing
  // the username, having read what it does.
  const [confirm, setConfirm] = useState<{ kind: "role"; u: User; role: Role } | { kind: "reset"; u: User } | null>(null);
  const manage = can("users:manage");

  const reset = useMutation({
    mutationFn: (u: User) => call(api.POST("/api/v1/users/{user_id}/reset-password", { params: { path: { user_id: u.id } } }))
      .then((r) => ({ user: u.username, otp: r.one_time_password, held: heldDetail(r) })),
    onSuccess: (s) => {
      setConfirm(null);
      if (s.held) notifications.show({ color: "blue", title: "Waiting for approval", message: s.held });
      else setSecret(s);
      void qc.invalidateQueries({ queryKey: qk.users });
    },
  });
  const update = useMutation({
    mutationFn: ({ u, body }: { u: User; body: { disabled?: boolean; role?: Role } }) =>
      call(api.PATCH("/api/v1/users/{user_id}", { params: { path: { user_id: u.id } }, body })),
    onSuccess: (u) => {
      void qc.invalidateQueries({ queryKey: qk.users });
      const held = heldDetail(u);
      notifications.show(held ? { color: "blue", title: "Waiting for approval", message: held }
        : { color: "teal", title: "User updated", message: `${u.username}: ${u.role}${u.disabled ? ", disabled" : ""}` });
      setDisabling(null);
      setConfirm(null);
    },
  });

  return (
    <Stack gap="md">
      <PageHeader title="Users" subtitle="People who sign in to the console; each has one role"
                  actions={<GuardedButton perm="users:manage" mode="hide" color="ink" leftSection={<IconPlus size={16} />}
                                          onClick={() => setCreating(true)} data-testid="create-user">Create user</GuardedButton>} />
      <ErrorAlert error={disabling || confirm ? null : reset.error ?? update.error} />
      <Paper withBorder radius="md">
        {users.error ? <ErrorAlert error={users.error} /> : users.isPending ? <Loading /> : users.data.length === 0 ? (
          <EmptyState title="No users" />
        ) : (
          <Table.ScrollContainer minWidth={800}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="users-table">
              <Table.Thead><Table.Tr>
                <Table.Th>User</Table.Th><Table.Th>Role</Table.Th><Table.Th>Status</Table.Th>
                <Table.Th>Last sign-in</Table.Th><Table.Th>Created</Table.Th>{manage && <Table.Th w={60}><span className="sr-only">Actions</span></Table.Th>}
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {users.data.map((u) => (
                  <Table.Tr key={u.id}>
                    <Table.Td><Text size="sm" fw={600}>{u.username}</Text>{u.full_name && <Text size="xs" c="dimmed">{u.full_name}</Text>}</Table.Td>
                    <Table.Td><Badge variant="light" color="ink" radius="sm">{u.role}</Badge></Table.Td>
                    <Table.Td>
                      <Group gap={4}>
                        {u.disabled ? <Badge color="red" variant="light" radius="sm">disabled</Badge>
                          : <Badge color="teal" variant="light" radius="sm">enabled</Badge>}
                        {u.must_change_password && <Badge color="yellow" variant="light" radius="sm">password change pending</Badge>}
                        {u.locked_until && new Date(u.locked_until).getTime() > Date.now() &&
                          <Badge color="orange" variant="light" radius="sm">locked</Badge>}
                      </Group>
                    </Table.Td>
                    <Table.Td title={fmtTime(u.last_login_at)}>{u.last_login_at ? fmtRelative(u.last_login_at) : "never"}</Table.Td>
                    <Table.Td>{fmtTime(u.created_at)}</Table.Td>
                    {manage && (
                      <Table.Td>
                        <Menu position="bottom-end" withinPortal>
                          <Menu.Target>
                            <Button size="compact-sm" variant="subtle" color="gray" aria-label={`Actions for ${u.username}`}><IconDots size={16} /></Button>
                          </Menu.Target>
                          <Menu.Dropdown>
                            <Menu.Label>Role</Menu.Label>
                            {ROLES.filter((r) => r !== u.role).map((r) => (
                              <Menu.Item key={r} onClick={() => setConfirm({ kind: "role", u, role: r })}>Make {r}…</Menu.Item>
                            ))}
                            <Menu.Divider />
                            <Menu.Item onClick={() => setConfirm({ kind: "reset", u })}>Reset password…</Menu.Item>
                            {u.disabled
                              ? <Menu.Item onClick={() => update.mutate({ u, body: { disabled: false } })}>Enable</Menu.Item>
                              : <Menu.Item color="red" disabled={u.username === me?.username} onClick={() => setDisabling(u)}>Disable…</Menu.Item>}
                          </Menu.Dropdown>
                        </Menu>
                      </Table.Td>
                    )}
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
      <CreateUserDialog opened={creating} onClose={() => setCreating(false)}
                        onCreated={(user, otp) => otp && setSecret({ user, otp })} />
      <SecretOnce opened={!!secret} title="One-time password" secret={secret?.otp ?? null}
                  label={`One-time password for ${secret?.user}`}
                  note="Give it to the user over a trusted channel. They must choose their own password at first sign-in."
                  onClose={() => setSecret(null)} />
      {confirm?.kind === "role" && (
        <TypedConfirmDialog opened onClose={() => { setConfirm(null); update.reset(); }}
                            title={`Make ${confirm.u.username} ${confirm.role}`} phrase={confirm.u.username}
                            actionLabel={`Make ${confirm.role}`} busy={update.isPending} error={update.error}
                            onConfirm={() => update.mutate({ u: confirm.u, body: { role: confirm.role } })}>
          <Text size="sm">{confirm.u.username} becomes {confirm.role}: {ROLE_HELP[confirm.role]}.</Text>
          <Text size="sm">Their sessions end at once; they sign in again with the new role. The change is audited
            {confirm.role === "admin" ? ", and may wait for a second administrator's approval where the two-person rule is on" : ""}.</Text>
        </TypedConfirmDialog>
      )}
      {confirm?.kind === "reset" && (
        <TypedConfirmDialog opened onClose={() => { setConfirm(null); reset.reset(); }}
                            title={`Reset the password of ${confirm.u.username}`} phrase={confirm.u.username}
                            actionLabel="Reset password" busy={reset.isPending} error={reset.error}
                            onConfirm={() => reset.mutate(confirm.u)}>
          <Text size="sm">Their current password stops working, their sessions end and their API tokens are revoked.
            A one-time password is shown to you once; they must choose their own at the next sign-in.</Text>
        </TypedConfirmDialog>
      )}
      {disabling && (
        <TypedConfirmDialog opened onClose={() => setDisabling(null)} title={`Disable ${disabling.username}`}
                            phrase={disabling.username} actionLabel="Disable user" busy={update.isPending} error={update.error}
                            onConfirm={() => update.mutate({ u: disabling, body: { disabled: true } })}>
          <Text size="sm">Their sessions end at once and they cannot sign in. Their API tokens stop working.</Text>
        </TypedConfirmDialog>
      )}
    </Stack>
  );
}

function CreateUserDialog({ opened, onClose, onCreated }: { opened: boolean; onClose: () => void; onCreated: (u: string, otp: string | null) => void }) {
  const qc = useQueryClient();
  const [username, setUsername] = useState("");
  const [fullName, setFullName] = useState("");
  const [role, setRole] = useState<Role>("operator");
  const create = useMutation({
    mutationFn: () => call(api.POST("/api/v1/users", { body: { username: username.trim(), full_name: fullName, role } })),
    onSuccess: (r) => {
      void qc.invalidateQueries({ queryKey: qk.users });
      const held = heldDetail(r);
      // Held: once approved, creating the same user again hands over the one-time password.
      if (held) notifications.show({ color: "blue", title: "Waiting for approval", message: held });
      else onCreated(r.user.username, r.one_time_password ?? null);
      close();
    },
  });
  const close = () => { setUsername(""); setFullName(""); setRole("operator"); create.reset(); onClose(); };
  const usernameError = lengthError(username.trim(), LIMITS.username, create.error, "username");
  const fullNameError = lengthError(fullName, LIMITS.fullName, create.error, "full_name");
  const invalid = username.trim().length < 2 || !!tooLong(username.trim(), LIMITS.username)
    || !!tooLong(fullName, LIMITS.fullName);
  return (
    <Modal opened={opened} onClose={close} title="Create user" centered>
      <form onSubmit={(e) => { e.preventDefault(); if (!invalid) create.mutate(); }} aria-label="Create user">
        <Stack gap="sm">
          <TextInput label="Username" required data-autofocus value={username} minLength={2} error={usernameError}
                     onChange={(e) => setUsername(e.currentTarget.value)} />
          <TextInput label="Full name" value={fullName} error={fullNameError} onChange={(e) => setFullName(e.currentTarget.value)} />
          <Select label="Role" data={ROLES} value={role} allowDeselect={false} onChange={(v) => v && setRole(v as Role)}
                  description={ROLE_HELP[role]} />
          <Text size="xs" c="dimmed">A one-time password is generated and shown once; the user must change it at first sign-in.</Text>
          <ErrorAlert error={create.error} title="User not created" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={invalid}>Create user</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
