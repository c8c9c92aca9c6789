import {
  Alert, Autocomplete, Badge, Button, Code, Group, Modal, Paper, Radio, Select, Stack, Table, Tabs, Text, TextInput, Textarea, Tooltip,
} from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { IconDownload, IconPlus } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { useSearchParams } from "react-router";
import { api, call, fieldError, type Schemas } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { PageHeader } from "../components/PageHeader";
import { LIMITS, tooLong } from "../textLimits";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { CopyValue, EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { groupError, kq, useKmipGroups, type KmipGrant } from "../kmip";
import { GrantDialog, GrantsView, GroupsView, RevokeGrantDialog, type GrantPreset } from "./KmipAccess";

type Client = Schemas["KmipClientPublic"];
type Issued = Schemas["KmipClientIssued"];
type KeyExport = Client["key_export"];

const QK = ["kmip-clients"] as const;
const EXPIRY_WARN_DAYS = 30;
// The roles a KMIP identity may hold (keyserver/core/permissions.py); kmip-client is the
// one made for programs.
const ROLES = ["kmip-client", "operator", "key-officer", "auditor", "storage-admin", "admin"];
export const KEY_EXPORT: Record<KeyExport, { label: string; help: string }> = {
  plaintext: { label: "plaintext", help: "KMIP Get delivers key material in the clear, as KMIP clients expect (within the role)" },
  wrapped: { label: "wrapped only", help: "key material leaves only wrapped under another key, inside the HSM" },
  none: { label: "none", help: "no key material leaves: the client uses keys only through server-side operations" },
};
// A DNS name: labels of letters, digits and hyphens (the certificate's SAN).
/** As `openssl x509 -noout -fingerprint -sha256` prints it (the server sends plain hex). */
export const opensslFingerprint = (hex: string) => (hex.toUpperCase().match(/../g) ?? []).join(":");

// As the server checks it (keyserver/core/kmip_clients.py CLIENT_NAME_RE): lower case only.
const DNS_NAME = /^(?=.{1,64}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

export function clientStatus(c: Client, now = Date.now()): { label: string; color: string } {
  if (c.revoked_at) return { label: "revoked", color: "red" };
  if (new Date(c.not_after).getTime() < now) return { label: "expired", color: "gray" };
  return { label: "active", color: "teal" };
}

function download(name: string, text: string) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/x-pem-file" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A DNS name that may wrap after each dot (and at hyphens, as text does): a long client
 *  name or group no longer widens the table past a 1,400 px window. */
export const breakAtDots = (name: string) =>
  name.split(/(?<=\.)/).flatMap((part, i) => (i ? [<wbr key={i} />, part] : [part]));

type View = "clients" | "groups" | "grants";
const VIEWS: View[] = ["clients", "groups", "grants"];

/** Clients, their groups and the grants between groups, one view at a time (`?view=`); a key's
 *  page links here with `?view=grants&grant_key=<key>` to open the grant dialog on that key, an
 *  audit record of a standalone object with `grant_object=<unique identifier>`. */
export function KmipClientsPage() {
  const [params, setParams] = useSearchParams();
  const view: View = VIEWS.find((v) => v === params.get("view")) ?? "clients";
  const [grantPreset, setGrantPreset] = useState<GrantPreset | null>(null);
  const linkedKey = params.get("grant_key");
  const linkedObject = params.get("grant_object");
  const preset = grantPreset ?? (linkedKey ? { key: linkedKey } : linkedObject ? { object: linkedObject } : null);
  const [revokingGrant, setRevokingGrant] = useState<KmipGrant | null>(null);
  const setView = (v: string | null) => setParams(v && v !== "clients" ? { view: v } : {}, { replace: true });
  const closeGrant = () => {
    setGrantPreset(null);
    if (linkedKey || linkedObject) setParams({ view: "grants" }, { replace: true });
  };
  return (
    <Stack gap="md">
      <PageHeader title="KMIP clients"
        subtitle="Programs that speak KMIP over mutual TLS, each with a certificate from the server's internal CA. Each sees the objects of its own group and what a grant gives it. Revoking one refuses it at once, on every replica." />
      <Tabs value={view} onChange={setView} keepMounted={false}>
        <Tabs.List mb="sm">
          <Tabs.Tab value="clients">Clients</Tabs.Tab>
          <Tabs.Tab value="groups" data-testid="kmip-groups-tab">Groups</Tabs.Tab>
          <Tabs.Tab value="grants" data-testid="kmip-grants-tab">Grants</Tabs.Tab>
        </Tabs.List>
        <Tabs.Panel value="clients"><ClientsView /></Tabs.Panel>
        <Tabs.Panel value="groups"><GroupsView onGrant={(group) => setGrantPreset({ group })} /></Tabs.Panel>
        <Tabs.Panel value="grants"><GrantsView onGrant={() => setGrantPreset({})} onRevoke={setRevokingGrant} /></Tabs.Panel>
      </Tabs>
      <GrantDialog opened={!!preset} preset={preset ?? {}} onClose={closeGrant} />
      <RevokeGrantDialog grant={revokingGrant} onClose={() => setRevokingGrant(null)} />
    </Stack>
  );
}

function ClientsView() {
  const { can } = useAuth();
  const qc = useQueryClient();
  const clients = useQuery({ queryKey: QK, queryFn: () => call(api.GET("/api/v1/kmip/clients")) });
  const [creating, setCreating] = useState(false);
  const [issued, setIssued] = useState<Issued | null>(null);
  const [revoking, setRevoking] = useState<Client | null>(null);
  const [exportOf, setExportOf] = useState<Client | null>(null);
  const [groupOf, setGroupOf] = useState<Client | null>(null);
  const revoke = useMutation({
    mutationFn: (c: Client) => call(api.DELETE("/api/v1/kmip/clients/{client_id}", { params: { path: { client_id: c.id } } })),
    onSuccess: (c) => {
      void qc.invalidateQueries({ queryKey: QK });
      setRevoking(null);
      notifications.show({ color: "teal", title: "KMIP client revoked", message: `${c.name}: refused from its next request` });
    },
  });
  const manage = can("kmip:clients");
  return (
    <Stack gap="md">
      {manage && (
        <Group justify="flex-end">
          <Button color="ink" leftSection={<IconPlus size={16} />} onClick={() => setCreating(true)}
                  data-testid="create-kmip-client">Create KMIP client</Button>
        </Group>
      )}
      <Paper withBorder radius="md">
        {clients.error ? <ErrorAlert error={clients.error} /> : clients.isPending ? <Loading /> : clients.data.length === 0 ? (
          <EmptyState title="No KMIP clients">Create one for each program that uses keys over KMIP (a database's TDE, a backup appliance, a storage array).</EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={940}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="kmip-clients-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Name and group</Table.Th><Table.Th>Role and key export</Table.Th><Table.Th>Certificate</Table.Th>
                <Table.Th>Expires</Table.Th><Table.Th>Created</Table.Th><Table.Th>Status</Table.Th><Table.Th />
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {clients.data.map((c) => {
                  const st = clientStatus(c);
                  const daysLeft = (new Date(c.not_after).getTime() - Date.now()) / 86_400_000;
                  return (
                    <Table.Tr key={c.id} data-client={c.name}>
                      <Table.Td style={{ overflowWrap: "anywhere" }}>
                        <Text size="sm" fw={600} ff="monospace">{breakAtDots(c.name)}</Text>
                        <Text size="xs" c="dimmed">group <Text span inherit ff="monospace" data-testid="kmip-client-group">{breakAtDots(c.group)}</Text></Text>
                      </Table.Td>
                      <Table.Td>
                        <Text size="sm">{c.role}</Text>
                        <Text size="xs" c="dimmed">key export{" "}
                          <Tooltip label={KEY_EXPORT[c.key_export].help} multiline w={280} withArrow>
                            <Text span inherit tabIndex={0} td="underline dotted" style={{ whiteSpace: "nowrap" }}>{KEY_EXPORT[c.key_export].label}</Text>
                          </Tooltip>
                        </Text>
                      </Table.Td>
                      <Table.Td>
                        <Group gap={2} wrap="nowrap">
                          <Code fz="xs" title={opensslFingerprint(c.fingerprint_sha256)}>
                            {opensslFingerprint(c.fingerprint_sha256).slice(0, 23)}…</Code>
                          <CopyValue value={opensslFingerprint(c.fingerprint_sha256)} label={`Copy the SHA-256 fingerprint of ${c.name}`} />
                        </Group>
                        <Text size="xs" c="dimmed" title={`serial ${c.serial}`}>
                          serial {c.serial.length > 16 ? `${c.serial.slice(0, 16)}…` : c.serial}</Text>
                      </Table.Td>
                      <Table.Td title={fmtTime(c.not_after)} style={{ whiteSpace: "nowrap" }}
                                c={!c.revoked_at && daysLeft < EXPIRY_WARN_DAYS ? "var(--sr-text-warning)" : undefined}>
                        {fmtRelative(c.not_after)}</Table.Td>
                      <Table.Td style={{ whiteSpace: "nowrap" }} title={fmtTime(c.created_at)}>
                        {fmtRelative(c.created_at)}<Text size="xs" c="dimmed">by {c.created_by}</Text></Table.Td>
                      <Table.Td><Badge color={st.color} variant="light" radius="sm" data-status={st.label} style={{ overflow: "visible" }}>{st.label}</Badge></Table.Td>
                      <Table.Td>
                        {manage && !c.revoked_at && (
                          <Group gap={4} wrap="nowrap">
                            <Button size="compact-sm" variant="subtle" color="gray" onClick={() => setGroupOf(c)}
                                    aria-label={`Change group of ${c.name}`}>Group</Button>
                            <Button size="compact-sm" variant="subtle" color="gray" onClick={() => setExportOf(c)}
                                    aria-label={`Change key export of ${c.name}`}>Key export</Button>
                            <Button size="compact-sm" variant="subtle" color="red" onClick={() => { revoke.reset(); setRevoking(c); }}
                                    aria-label={`Revoke KMIP client ${c.name}`}>Revoke</Button>
                          </Group>
                        )}
                      </Table.Td>
                    </Table.Tr>
                  );
                })}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
      </Paper>
      <CreateDialog opened={creating} onClose={() => setCreating(false)} onIssued={(i) => { setCreating(false); setIssued(i); }} />
      <IssuedDialog issued={issued} onClose={() => setIssued(null)} />
      <KeyExportDialog client={exportOf} onClose={() => setExportOf(null)} />
      <GroupDialog client={groupOf} onClose={() => setGroupOf(null)} />
      <TypedConfirmDialog opened={!!revoking} onClose={() => setRevoking(null)} title={`Revoke ${revoking?.name ?? ""}`}
        phrase={revoking?.name ?? ""} actionLabel="Revoke KMIP client" busy={revoke.isPending} error={revoke.error}
        onConfirm={() => revoking && revoke.mutate(revoking)}>
        <Text size="sm">Every connection and request with this certificate is refused from its next request, on every
          replica. The keys it created stay. This cannot be undone: issue a new client to let the program back in.</Text>
      </TypedConfirmDialog>
    </Stack>
  );
}

function CreateDialog({ opened, onClose, onIssued }: { opened: boolean; onClose: () => void; onIssued: (i: Issued) => void }) {
  const qc = useQueryClient();
  const [name, setName] = useState("");
  const [role, setRole] = useState("kmip-client");
  const [keyExport, setKeyExport] = useState<KeyExport>("plaintext");
  const [csr, setCsr] = useState("");
  const [group, setGroup] = useState("");
  const groups = useKmipGroups(opened);
  const nameError = tooLong(name.trim(), LIMITS.kmipClientName) ?? (name && !DNS_NAME.test(name.trim()) ? "A DNS name in lower case, such as backup-01.example.com (letters, digits, hyphens, dots)" : null);
  const csrError = csr.trim() && !csr.includes("BEGIN CERTIFICATE REQUEST") ? "A PEM certificate request (-----BEGIN CERTIFICATE REQUEST-----)" : null;
  const create = useMutation({
    mutationFn: () => call(api.POST("/api/v1/kmip/clients", { body: {
      name: name.trim(), role, key_export: keyExport, csr: csr.trim() || null, ...(group.trim() ? { group: group.trim() } : {}) } })),
    onSuccess: (r) => {
      void qc.invalidateQueries({ queryKey: QK });
      void qc.invalidateQueries({ queryKey: kq.groups });
      reset();
      onIssued(r);
    },
  });
  const groupErr = groupError(group) ?? fieldError(create.error, "group");
  const sharing = groups.data?.find((g) => g.name === group.trim())?.clients ?? [];
  const reset = () => { setName(""); setRole("kmip-client"); setKeyExport("plaintext"); setCsr(""); setGroup(""); create.reset(); };
  const close = () => { reset(); onClose(); };
  return (
    <Modal opened={opened} onClose={close} title="Create KMIP client" centered size="lg">
      <form aria-label="Create KMIP client" onSubmit={(e) => { e.preventDefault(); if (!nameError && !csrError && !groupErr) create.mutate(); }}>
        <Stack gap="sm">
          <TextInput label="Name" description="The client's DNS name: its certificate's subject and SAN" required data-autofocus
                     placeholder="backup-01.example.com" value={name} error={nameError ?? fieldError(create.error, "name")}
                     onChange={(e) => setName(e.currentTarget.value)} />
          <Select label="Role" description="What it may do; kmip-client is made for programs (use, export and retire keys)"
                  data={ROLES} value={role} onChange={(v) => setRole(v ?? "kmip-client")} allowDeselect={false} />
          <Autocomplete label="Group (optional)" data={(groups.data ?? []).map((g) => g.name).sort()} value={group} onChange={setGroup}
                        placeholder={name.trim() || "the client's name"} error={groupErr} comboboxProps={{ withinPortal: true }}
                        description={sharing.length ? `Shares the objects of this group with ${sharing.join(", ")}`
                          : "Clients of one group share its objects (the certificates of one cluster). Empty: a group of its own, named after it."}
                        data-testid="create-kmip-client-group" />
          <Select label="Key export" description={KEY_EXPORT[keyExport].help} allowDeselect={false}
                  data={(Object.keys(KEY_EXPORT) as KeyExport[]).map((k) => ({ value: k, label: KEY_EXPORT[k].label }))}
                  value={keyExport} onChange={(v) => setKeyExport((v ?? "plaintext") as KeyExport)} />
          <Textarea label="Certificate request (optional)" autosize minRows={3} maxRows={8} error={csrError}
                    description="Paste a PEM CSR made on the client's host so its private key never leaves it. Leave empty to let the server make the key pair (shown once)."
                    value={csr} onChange={(e) => setCsr(e.currentTarget.value)} styles={{ input: { fontFamily: "var(--mantine-font-family-monospace)", fontSize: 12 } }} />
          <ErrorAlert error={create.error} title="KMIP client not created" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={!name.trim() || !!nameError || !!csrError || !!groupErr}
                    data-testid="create-kmip-client-submit">Create</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function IssuedDialog({ issued, onClose }: { issued: Issued | null; onClose: () => void }) {
  const name = issued?.client.name ?? "";
  return (
    <Modal opened={!!issued} onClose={onClose} title="KMIP client created" centered size="lg"
           closeOnClickOutside={false} closeOnEscape={false} withCloseButton={false}>
      {issued && (
        <Stack gap="sm" data-testid="kmip-issued">
          {issued.private_key_pem ? (
            <Alert color="orange" variant="light" title="The private key is shown this once">
              The server does not keep it. Download it now and install it on the client's host only.
            </Alert>
          ) : <Text size="sm">Signed from your certificate request: the private key never left the client's host.</Text>}
          <Group gap="xs">
            <Button variant="default" leftSection={<IconDownload size={16} />} onClick={() => download(`${name}-cert.pem`, issued.certificate_pem)}>
              {name}-cert.pem</Button>
            {issued.private_key_pem && (
              <Button variant="default" leftSection={<IconDownload size={16} />} data-testid="download-key"
                      onClick={() => download(`${name}-key.pem`, issued.private_key_pem ?? "")}>{name}-key.pem</Button>
            )}
            <Button variant="default" leftSection={<IconDownload size={16} />} onClick={() => download(`${name}-ca.pem`, issued.ca_certificate_pem)}>
              {name}-ca.pem</Button>
          </Group>
          <Text size="sm">A PyKMIP client (<Code>pykmip.conf</Code>) uses them like this:</Text>
          <Code block fz="xs" tabIndex={0} aria-label="PyKMIP configuration">{`[client]
host=<this server's KMIP address>
port=5696
certfile=/etc/pykmip/${name}-cert.pem
keyfile=/etc/pykmip/${name}-key.pem
ca_certs=/etc/pykmip/${name}-ca.pem`}</Code>
          <Text size="xs" c="dimmed">Certificate SHA-256 {opensslFingerprint(issued.client.fingerprint_sha256)} · valid until {fmtTime(issued.client.not_after)}</Text>
          <Group justify="flex-end">
            <Button color="ink" onClick={onClose} data-testid="kmip-issued-done">I have saved the files</Button>
          </Group>
        </Stack>
      )}
    </Modal>
  );
}

function KeyExportDialog({ client, onClose }: { client: Client | null; onClose: () => void }) {
  const qc = useQueryClient();
  const [value, setValue] = useState<KeyExport | null>(null);
  const chosen = value ?? client?.key_export ?? "plaintext";
  const save = useMutation({
    mutationFn: () => call(api.PATCH("/api/v1/kmip/clients/{client_id}", {
      params: { path: { client_id: client?.id ?? "" } }, body: { key_export: chosen } })),
    onSuccess: (c) => {
      void qc.invalidateQueries({ queryKey: QK });
      notifications.show({ color: "teal", title: "Key export changed", message: `${c.name}: ${KEY_EXPORT[c.key_export].label}` });
      close();
    },
  });
  const close = () => { setValue(null); save.reset(); onClose(); };
  return (
    <Modal opened={!!client} onClose={close} title={`Key export of ${client?.name ?? ""}`} centered>
      <Stack gap="sm">
        <Radio.Group label="What key material KMIP Get may deliver to it" value={chosen}
                     onChange={(v) => setValue(v as KeyExport)}>
          <Stack gap="xs" mt={6}>
            {(Object.keys(KEY_EXPORT) as KeyExport[]).map((k) => (
              <Radio key={k} value={k} label={KEY_EXPORT[k].label} description={KEY_EXPORT[k].help} />
            ))}
          </Stack>
        </Radio.Group>
        {client && chosen !== client.key_export && (
          <Text size="sm" data-testid="key-export-change">From its next request, {client.name}: {KEY_EXPORT[chosen].help}.</Text>
        )}
        <ErrorAlert error={save.error} title="Not changed" />
        <Group justify="flex-end">
          <Button variant="default" onClick={close}>Cancel</Button>
          <Button color="ink" loading={save.isPending} disabled={!client || chosen === client.key_export} onClick={() => save.mutate()}
                  data-testid="key-export-save">Save</Button>
        </Group>
      </Stack>
    </Modal>
  );
}

/** Move a client to another group: from its next request it sees that group's objects. What it
 *  created stays in its old group (objects never follow their creator). */
function GroupDialog({ client, onClose }: { client: Client | null; onClose: () => void }) {
  const qc = useQueryClient();
  const [value, setValue] = useState<string | null>(null);
  const groups = useKmipGroups(!!client);
  const typed = value ?? client?.group ?? "";
  const next = typed.trim();
  const changed = !!client && next !== client.group;
  const save = useMutation({
    mutationFn: () => call(api.PATCH("/api/v1/kmip/clients/{client_id}", {
      params: { path: { client_id: client?.id ?? "" } }, body: { group: next } })),
    onSuccess: (c) => {
      void qc.invalidateQueries({ queryKey: QK });
      void qc.invalidateQueries({ queryKey: kq.groups });
      notifications.show({ color: "teal", title: "Group changed", message: `${c.name}: group ${c.group}` });
      close();
    },
  });
  const error = next ? groupError(next) ?? fieldError(save.error, "group") : "Required: the group whose objects it sees";
  const close = () => { setValue(null); save.reset(); onClose(); };
  const others = (groups.data?.find((g) => g.name === next)?.clients ?? []).filter((n) => n !== client?.name);
  return (
    <Modal opened={!!client} onClose={close} title={`Group of ${client?.name ?? ""}`} centered>
      <form aria-label={`Group of ${client?.name ?? ""}`} onSubmit={(e) => { e.preventDefault(); if (changed && !error) save.mutate(); }}>
        <Stack gap="sm">
          <Autocomplete label="Group" required data={(groups.data ?? []).map((g) => g.name).sort()} value={typed}
                        onChange={setValue} error={error} comboboxProps={{ withinPortal: true }}
                        description="1-64 characters: lower-case letters, digits, dots, hyphens, underscores"
                        data-testid="kmip-group-input" />
          {client && changed && !error && (
            <Text size="sm" data-testid="kmip-group-change">
              From its next request, {client.name} sees the objects of group <b>{next}</b>
              {others.length ? ` (with ${others.join(", ")})` : " (a group of its own)"} and no longer those
              of <b>{client.group}</b>, unless a grant gives them. The objects it created stay in {client.group}.
            </Text>
          )}
          <ErrorAlert error={save.error} title="Group not changed" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={save.isPending} disabled={!changed || !!error}
                    data-testid="kmip-group-save">Save</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
