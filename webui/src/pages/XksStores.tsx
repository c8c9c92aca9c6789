// AWS KMS external key stores: AWS KMS keeps the key material of such a store here and
// calls Strongroom's XKS proxy, SigV4-signed with a credential issued here, for every
// Encrypt and Decrypt (docs/integrations.md, decisions 0020 and 0023). Here people connect
// one, see its keys and credential, and cut it off.
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
import { fieldError } from "../api/client";
import { LIMITS, lengthError, tooLong } from "../textLimits";
import {
  awsSubjectFor, regionError, storeNameError, subjectError, useXksStores, xksApi, xksPath, xksq, xksState,
  type XksIssued, type XksState, type XksStore,
} from "../xks";

const STATE_COLOR: Record<XksState, string> = { active: "teal", revoked: "red" };

export function XksStateBadge({ s }: { s: Pick<XksStore, "revoked_at"> }) {
  const st = xksState(s);
  return <Badge color={STATE_COLOR[st]} variant="light" radius="sm" data-state={st} style={{ overflow: "visible" }}>{st}</Badge>;
}

export function XksStoresPage() {
  const stores = useXksStores();
  const [connecting, setConnecting] = useState(false);
  const [issued, setIssued] = useState<XksIssued | null>(null);
  const data = stores.data;
  return (
    <Stack gap="md">
      <PageHeader title="AWS key stores"
        subtitle="AWS KMS external key stores whose keys are held here: every Encrypt and Decrypt in AWS KMS on a key of such a store is a call to this server's XKS proxy, signed with the store's credential, and audited. The keys never leave the HSM."
        actions={<GuardedButton perm="xks:manage" mode="hide" color="ink" leftSection={<IconPlus size={16} />}
                                onClick={() => setConnecting(true)} data-testid="connect-xks">Connect a key store</GuardedButton>} />
      <Paper withBorder radius="md">
        {stores.error ? <ErrorAlert error={stores.error} title="AWS key stores could not be loaded" />
          : stores.isPending ? <Loading label="Loading AWS key stores…" />
          : data?.total === 0 ? <NoStoresYet onConnect={() => setConnecting(true)} />
          : <StoresTable stores={data?.items ?? []} />}
      </Paper>
      {data && data.total > 0 && (
        <Text size="sm" c="dimmed" data-testid="xks-total">
          {data.total} key store{data.total === 1 ? "" : "s"}
          {" · "}revoked ones stay listed, with their name, for the audit trail
        </Text>
      )}
      <ConnectDialog opened={connecting} onClose={() => setConnecting(false)}
                     onConnected={(i) => { setConnecting(false); setIssued(i); }} />
      <CredentialDialog issued={issued} onClose={() => setIssued(null)} />
    </Stack>
  );
}

function NoStoresYet({ onConnect }: { onConnect: () => void }) {
  const { can } = useAuth();
  return (
    <Stack gap="xs" py="md" data-testid="no-xks">
      <EmptyState title="No AWS key store connected yet">
        Connecting one gives AWS KMS a credential and the proxy URI to enter in its external key store. Then grant it a
        Strongroom AES-256 key under the external key id AWS KMS will name.
      </EmptyState>
      <Center>
        {can("xks:manage")
          ? <Button color="ink" leftSection={<IconPlus size={16} />} onClick={onConnect}>Connect the first key store</Button>
          : <Text size="sm" c="dimmed">Connecting one needs the xks:manage permission (key officers and administrators).</Text>}
      </Center>
    </Stack>
  );
}

function StoresTable({ stores }: { stores: XksStore[] }) {
  return (
    <Table.ScrollContainer minWidth={820}>
      <Table highlightOnHover fz="sm" verticalSpacing={8} data-testid="xks-table">
        <Table.Thead><Table.Tr>
          <Table.Th>Name</Table.Th><Table.Th>Region</Table.Th><Table.Th>State</Table.Th><Table.Th>Keys</Table.Th>
          <Table.Th>Credential issued</Table.Th><Table.Th>Mutual TLS</Table.Th><Table.Th>Last call</Table.Th>
        </Table.Tr></Table.Thead>
        <Table.Tbody>
          {stores.map((s) => (
            <Table.Tr key={s.id} data-xks={s.name}>
              <Table.Td>
                <Anchor component={Link} to={xksPath(s.name)} fw={600} size="sm" ff="monospace">{s.name}</Anchor>
                {s.description && <Text size="xs" c="dimmed" lineClamp={1}>{s.description}</Text>}
              </Table.Td>
              <Table.Td ff="monospace">{s.region}</Table.Td>
              <Table.Td style={{ minWidth: 90 }} title={s.revoked_at ? `revoked ${fmtTime(s.revoked_at)}` : undefined}>
                <XksStateBadge s={s} /></Table.Td>
              <Table.Td data-testid="xks-keys-count">
                {s.keys.length === 0 ? <Text span size="sm" c="var(--sr-text-warning)">none: AWS KMS can use no key</Text>
                  : s.keys.length}
              </Table.Td>
              <Table.Td title={fmtTime(s.credential_issued_at)} style={{ whiteSpace: "nowrap" }} data-testid="xks-credential-age">
                {fmtRelative(s.credential_issued_at)}
                {s.previous_access_key_id && <Text size="xs" c="var(--sr-text-warning)">previous one still accepted</Text>}
              </Table.Td>
              <Table.Td data-testid="xks-mtls" title={s.client_cert_subject ?? undefined}>
                {s.client_cert_subject ? "on" : <Text span size="sm" c="dimmed">off</Text>}
              </Table.Td>
              <Table.Td title={fmtTime(s.last_seen_at)} style={{ whiteSpace: "nowrap" }}>
                {s.last_seen_at ? fmtRelative(s.last_seen_at) : <Text span size="sm" c="dimmed">never</Text>}
              </Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

function ConnectDialog({ opened, onClose, onConnected }: {
  opened: boolean; onClose: () => void; onConnected: (i: XksIssued) => void;
}) {
  const qc = useQueryClient();
  const [name, setName] = useState("");
  const [region, setRegion] = useState("");
  const [description, setDescription] = useState("");
  const [subject, setSubject] = useState("");
  const n = name.trim(), r = region.trim(), sub = subject.trim();
  const create = useMutation({
    mutationFn: () => xksApi.create({ name: n, region: r, description, ...(sub ? { client_cert_subject: sub } : {}) }),
    onSuccess: (i) => { void qc.invalidateQueries({ queryKey: xksq.all }); reset(); onConnected(i); },
  });
  const reset = () => { setName(""); setRegion(""); setDescription(""); setSubject(""); create.reset(); };
  const close = () => { reset(); onClose(); };
  const nameError = storeNameError(n) ?? fieldError(create.error, "name");
  const regionErr = regionError(r) ?? fieldError(create.error, "region");
  const subjectErr = subjectError(sub) ?? fieldError(create.error, "client_cert_subject");
  const descriptionError = lengthError(description, LIMITS.databaseDescription, create.error, "description");
  const invalid = !n || !r || !!storeNameError(n) || !!regionError(r) || !!subjectError(sub)
    || !!tooLong(description, LIMITS.databaseDescription);
  return (
    <Modal opened={opened} onClose={close} title="Connect a key store" centered size="lg">
      <form aria-label="Connect a key store" onSubmit={(e) => { e.preventDefault(); if (!invalid) create.mutate(); }}>
        <Stack gap="sm">
          <TextInput label="Name" required data-autofocus placeholder="aws-prod"
                     description="Part of the proxy URI path (/xks/<name>) and the audit actor xks:<name>. It cannot be changed."
                     value={name} error={nameError} onChange={(e) => setName(e.currentTarget.value)} />
          <TextInput label="AWS region" required placeholder="eu-west-1"
                     description="The region of the key store in AWS KMS: it signs with it, and a signature for another region is refused."
                     value={region} error={regionErr} onChange={(e) => setRegion(e.currentTarget.value)} />
          <Textarea label="Description" description="Optional: the AWS account, who answers for it" autosize minRows={2} maxRows={8}
                    value={description} error={descriptionError} onChange={(e) => setDescription(e.currentTarget.value)} />
          <TextInput label="Client certificate subject (mutual TLS)"
                     placeholder={awsSubjectFor(r && !regionError(r) ? r : "eu-west-1")}
                     description={"Optional. Only when the key store in AWS KMS uses mutual TLS and calls the XKS port: AWS KMS's certificate names "
                       + `${awsSubjectFor(r && !regionError(r) ? r : "<region>")}. Empty: SigV4 alone; it can be set later.`}
                     value={subject} error={subjectErr} onChange={(e) => setSubject(e.currentTarget.value)}
                     data-testid="xks-subject-input" />
          <Text size="sm" c="dimmed">The next screen shows the store's access key id and secret access key once, with the proxy
            URI to enter in AWS KMS. AWS KMS can use no key until you grant it one.</Text>
          <ErrorAlert error={create.error} title="Key store not connected" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={create.isPending} disabled={invalid}
                    data-testid="connect-xks-submit">Connect</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function Value({ label, value, testId, copyLabel }: { label: string; value: string; testId: string; copyLabel: string }) {
  return (
    <Stack gap={4}>
      <Text size="sm" fw={600}>{label}</Text>
      <Group gap="xs" wrap="nowrap">
        <Code block data-testid={testId} style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}>{value}</Code>
        <CopyValue value={value} label={copyLabel} />
      </Group>
    </Stack>
  );
}

/** The credential shown once (after connecting or re-issuing), with the values AWS KMS asks
 *  for and what to do there. Dismissed only by its own button. */
export function CredentialDialog({ issued, onClose, reissued = false }: {
  issued: XksIssued | null; onClose: () => void; reissued?: boolean;
}) {
  const name = issued?.store.name ?? "";
  const noKeys = (issued?.store.keys.length ?? 0) === 0;
  const mtls = issued?.store.client_cert_subject;
  return (
    <Modal opened={!!issued} onClose={onClose} title={reissued ? `New credential for ${name}` : `${name} connected`} centered size="xl"
           closeOnClickOutside={false} closeOnEscape={false} withCloseButton={false}>
      {issued && (
        <Stack gap="sm" data-testid="xks-credential">
          <Alert color="orange" variant="light" icon={<IconAlertTriangle size={18} />} title="The secret access key is shown this once">
            The server keeps it sealed and never shows it again. Copy it into AWS KMS now; if it is lost, issue a new
            credential from the key store's page.
            {reissued && " The previous credential stays accepted until you retire it on the key store's page."}
          </Alert>
          <Value label="Access key id" value={issued.access_key_id} testId="xks-access-key-id" copyLabel="Copy the access key id" />
          <Value label="Secret access key" value={issued.secret_access_key} testId="xks-secret" copyLabel="Copy the secret access key" />
          {!reissued && <>
            <Value label="Proxy URI endpoint" value={issued.proxy_uri_endpoint} testId="xks-endpoint" copyLabel="Copy the proxy URI endpoint" />
            <Value label="Proxy URI path" value={issued.proxy_uri_path} testId="xks-path" copyLabel="Copy the proxy URI path" />
          </>}
          <Stack gap={4}>
            <Text size="sm" fw={600}>What to do next, in AWS KMS</Text>
            {reissued ? (
              <List type="ordered" size="sm" spacing={4}>
                <List.Item>Update the key store's proxy authentication credential with this access key id and secret
                  (<Code>UpdateCustomKeyStore</Code>, or Edit in the AWS console).</List.Item>
                <List.Item>Wait until AWS KMS shows the store connected with the new credential and its hosts have moved
                  over (allow several minutes).</List.Item>
                <List.Item>Then retire the previous credential on the key store's page here.</List.Item>
              </List>
            ) : (
              <List type="ordered" size="sm" spacing={4}>
                {noKeys && <List.Item>Grant the store a Strongroom AES-256 key on its page here, under the external key
                  id AWS KMS will name.</List.Item>}
                <List.Item>Create an external key store with public endpoint connectivity (or a VPC endpoint service):
                  the proxy URI endpoint and path above, the proxy authentication credential = this access key id and
                  secret.{mtls && <> Mutual TLS is required (subject <Code>{mtls}</Code>): point the endpoint at this server's
                  XKS port instead, <Code>https://NAME:PORT</Code>, and turn the store's mutual TLS on.</>}</List.Item>
                <List.Item>Connect the store, then create a KMS key in it with the external key id granted here.</List.Item>
                <List.Item>Check back here: the store's page shows AWS KMS's last call, and the audit log its records
                  (actor <Code>xks:{name}</Code>).</List.Item>
              </List>
            )}
          </Stack>
          <Group justify="flex-end" gap="xs">
            {!reissued && <Button variant="default" component={Link} to={xksPath(name)} onClick={onClose}>Open its page</Button>}
            <Button color="ink" onClick={onClose} data-testid="xks-credential-done">I have stored the secret</Button>
          </Group>
        </Stack>
      )}
    </Modal>
  );
}
