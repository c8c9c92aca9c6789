// One AWS KMS external key store: the keys AWS KMS may use through it (external key id →
// Strongroom key), its SigV4 credential and its rotation, the mutual TLS subject it
// requires, and revocation.
import {
  Alert, Anchor, Button, Code, Group, Modal, Paper, Select, SimpleGrid, Stack, Table, Text, TextInput, Title,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { notifications } from "@mantine/notifications";
import { IconKey, IconPlus } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState, type ReactNode } from "react";
import { Link, useParams } from "react-router";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { GuardedButton } from "../components/Guarded";
import { PageHeader } from "../components/PageHeader";
import { TypedConfirmDialog } from "../components/TypedConfirmDialog";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { useKeys } from "../queries";
import {
  awsSubjectFor, externalIdError, proxyUriPath, subjectError, useXksStore, xksApi, xksq,
  type XksIssued, type XksKey, type XksStore,
} from "../xks";
import { CredentialDialog, XksStateBadge } from "./XksStores";

type Dialog = null | "grant" | "rotate" | "retire" | "mtls" | "revoke";

export function XksStoreDetailPage() {
  const { name = "" } = useParams();
  const store = useXksStore(name);
  if (store.error) {
    return (
      <Stack>
        <Crumbs name={name} />
        <PageHeader title={name} />
        <ErrorAlert error={store.error} title="Key store could not be loaded" />
      </Stack>
    );
  }
  if (store.isPending) return <Loading label="Loading key store…" />;
  return <StoreView s={store.data} />;
}

function Crumbs({ name }: { name: string }) {
  return <Text size="sm"><Anchor component={Link} to="/aws-key-stores" underline="always">AWS key stores</Anchor> / {name}</Text>;
}

/** After a change: the lists and (a moment later, when the audit chainer has appended its
 *  record) the audit views. */
function useRefresh() {
  const qc = useQueryClient();
  return () => {
    void qc.invalidateQueries({ queryKey: xksq.all });
    for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
  };
}

function StoreView({ s }: { s: XksStore }) {
  const { can } = useAuth();
  const refresh = useRefresh();
  const [dialog, setDialog] = useState<Dialog>(null);
  const [removing, setRemoving] = useState<XksKey | null>(null);
  const [issued, setIssued] = useState<XksIssued | null>(null);
  const revoked = !!s.revoked_at;
  const manage = can("xks:manage") && !revoked;
  const rotate = useMutation({
    mutationFn: () => xksApi.rotate(s.name),
    onSuccess: (r) => { refresh(); setDialog(null); setIssued(r); },
  });
  const retire = useMutation({
    mutationFn: () => xksApi.retirePrevious(s.name),
    onSuccess: () => {
      refresh();
      setDialog(null);
      notifications.show({ color: "teal", title: "Previous credential retired",
                           message: `${s.name}: access key id ${s.previous_access_key_id ?? ""} is refused from now on` });
    },
  });
  const revoke = useMutation({
    mutationFn: () => xksApi.revoke(s.name),
    onSuccess: () => {
      refresh();
      setDialog(null);
      notifications.show({ color: "teal", title: "Key store revoked", message: `${s.name}: AWS KMS's calls are refused from now on` });
    },
  });
  return (
    <Stack gap="md">
      <Crumbs name={s.name} />
      <PageHeader
        title={<Group gap="sm"><span data-testid="xks-name">{s.name}</span><XksStateBadge s={s} /></Group>}
        subtitle={s.description || "No description"}
        actions={!revoked && <>
          <GuardedButton perm="xks:manage" mode="hide" color="ink" leftSection={<IconPlus size={16} />}
                         onClick={() => setDialog("grant")} data-testid="xks-grant-key">Grant a key</GuardedButton>
          <GuardedButton perm="xks:manage" mode="hide" variant="outline" color="red"
                         onClick={() => { revoke.reset(); setDialog("revoke"); }} data-testid="revoke-xks">Revoke</GuardedButton>
        </>} />
      {revoked && (
        <Alert color="red" variant="light" title={`Revoked ${fmtTime(s.revoked_at)}`} data-testid="xks-revoked">
          Every call AWS KMS makes with its credential is refused, health checks included: AWS KMS shows the store
          disconnected and cannot use its keys, so what it encrypted under them cannot be decrypted. To serve them again,
          connect a new key store, grant the same keys under the same external key ids, and update the store in AWS KMS
          with the new path and credential.
        </Alert>
      )}
      <Paper withBorder radius="md" p="md">
        <Title order={2} size="h5" mb="sm">Properties</Title>
        <SimpleGrid cols={2} spacing={6} verticalSpacing={6} style={{ gridTemplateColumns: "140px minmax(0, 1fr)" }}>
          <Prop label="AWS region"><Code>{s.region}</Code></Prop>
          <Prop label="Proxy URI path"><Code data-testid="xks-detail-path">{proxyUriPath(s)}</Code></Prop>
          <Prop label="Connected">{fmtTime(s.created_at)} by {s.created_by}</Prop>
          <Prop label="Last call">{s.last_seen_at ? `${fmtTime(s.last_seen_at)} (${fmtRelative(s.last_seen_at)})`
            : "never: AWS KMS has not called yet (is the store connected in AWS KMS?)"}</Prop>
          {revoked && <Prop label="Revoked">{fmtTime(s.revoked_at)}</Prop>}
        </SimpleGrid>
      </Paper>
      <Paper withBorder radius="md" p="md" component="section" aria-labelledby="xks-keys-title">
        <Stack gap={0} mb="sm">
          <Title order={2} size="h5" id="xks-keys-title">Keys AWS KMS may use</Title>
          <Text size="xs" c="dimmed">Each maps the external key id of a KMS key in AWS to a Strongroom AES-256 key, which
            stays in the HSM. A rotation here is a new version for new Encrypts; older ciphertexts keep decrypting.</Text>
        </Stack>
        <KeysTable s={s} manage={manage} onRemove={(k) => setRemoving(k)} />
      </Paper>
      <Paper withBorder radius="md" p="md" component="section" aria-labelledby="xks-credential-title">
        <Group justify="space-between" align="flex-start" mb="sm">
          <Stack gap={0} style={{ flex: "1 1 16rem", minWidth: 0 }}>
            <Title order={2} size="h5" id="xks-credential-title">Proxy authentication credential</Title>
            <Text size="xs" c="dimmed">AWS KMS signs every call with it (SigV4). A re-issue keeps the previous one accepted
              until it is retired, so AWS KMS can move over without an outage.</Text>
          </Stack>
          {manage && <Group gap="xs">
            <Button variant="default" onClick={() => { rotate.reset(); setDialog("rotate"); }}
                    data-testid="rotate-xks-credential">Issue a new credential</Button>
            {s.previous_access_key_id && (
              <Button variant="outline" color="red" onClick={() => { retire.reset(); setDialog("retire"); }}
                      data-testid="retire-xks-previous">Retire previous credential</Button>
            )}
          </Group>}
        </Group>
        <SimpleGrid cols={2} spacing={6} verticalSpacing={6} style={{ gridTemplateColumns: "140px minmax(0, 1fr)" }}>
          <Prop label="Access key id"><Code data-testid="xks-current-key-id">{s.access_key_id}</Code></Prop>
          <Prop label="Issued">{fmtTime(s.credential_issued_at)} ({fmtRelative(s.credential_issued_at)})</Prop>
          <Prop label="Previous">{s.previous_access_key_id
            ? <span data-testid="xks-previous-key-id"><Code>{s.previous_access_key_id}</Code> still accepted: retire it once
                AWS KMS uses the new one</span>
            : "none: only the current credential is accepted"}</Prop>
        </SimpleGrid>
      </Paper>
      <Paper withBorder radius="md" p="md" component="section" aria-labelledby="xks-mtls-title">
        <Group justify="space-between" align="flex-start">
          <Stack gap={4} style={{ flex: "1 1 16rem", minWidth: 0 }}>
            <Title order={2} size="h5" id="xks-mtls-title">Mutual TLS</Title>
            <Text size="sm" data-testid="xks-mtls-state">
              {s.client_cert_subject
                ? <>On: every call must come over the XKS port with a client certificate naming <Code>{s.client_cert_subject}</Code>,
                  and be signed as well.</>
                : "Off: calls are authenticated by their SigV4 signature alone, on the REST port or the XKS port."}
            </Text>
          </Stack>
          {manage && <Button variant="default" onClick={() => setDialog("mtls")} data-testid="xks-mtls-change">
            {s.client_cert_subject ? "Change" : "Require a client certificate"}</Button>}
        </Group>
      </Paper>
      <GrantDialog s={s} opened={dialog === "grant"} onClose={() => setDialog(null)} />
      <RemoveKeyDialog s={s} k={removing} onClose={() => setRemoving(null)} />
      <MtlsDialog s={s} opened={dialog === "mtls"} onClose={() => setDialog(null)} />
      <Modal opened={dialog === "rotate"} onClose={() => setDialog(null)} title={`Issue a new credential for ${s.name}`} centered>
        <Stack gap="sm">
          <Text size="sm">A new access key id and secret. The current one, {s.access_key_id}, stays accepted until you retire
            it: update the store's proxy authentication credential in AWS KMS, then retire the previous one here.</Text>
          {s.previous_access_key_id && (
            <Alert color="orange" variant="light" data-testid="rotate-drops-oldest">
              The previous credential, {s.previous_access_key_id}, has not been retired: it is refused from the moment the
              new one is issued. Make sure AWS KMS no longer uses it.
            </Alert>
          )}
          <Text size="sm">The new secret is shown once.</Text>
          <ErrorAlert error={rotate.error} title="No new credential issued" />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setDialog(null)}>Cancel</Button>
            <Button color="ink" loading={rotate.isPending} onClick={() => rotate.mutate()}
                    data-testid="rotate-xks-confirm">Issue a new credential</Button>
          </Group>
        </Stack>
      </Modal>
      <Modal opened={dialog === "retire"} onClose={() => setDialog(null)} title={`Retire the previous credential of ${s.name}`} centered>
        <Stack gap="sm">
          <Text size="sm">Access key id <Code>{s.previous_access_key_id}</Code> is refused from now on; only{" "}
            <Code>{s.access_key_id}</Code> stays accepted.</Text>
          <Text size="sm">Until now both were accepted, so AWS KMS could move over without an outage. Do this only once AWS KMS
            shows the store connected with the new credential and its hosts have moved over: AWS says this takes some time,
            so allow several minutes. A host still signing with the old one gets 401 and AWS KMS reports the store's
            calls failing.</Text>
          <ErrorAlert error={retire.error} title="Previous credential not retired" />
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setDialog(null)}>Cancel</Button>
            <Button color="red" loading={retire.isPending} onClick={() => retire.mutate()}
                    data-testid="retire-xks-confirm">Retire previous credential</Button>
          </Group>
        </Stack>
      </Modal>
      <TypedConfirmDialog opened={dialog === "revoke"} onClose={() => setDialog(null)} title={`Revoke ${s.name}`}
                          phrase={s.name} actionLabel="Revoke key store" busy={revoke.isPending} error={revoke.error}
                          onConfirm={() => revoke.mutate()}>
        <Text size="sm" fw={600} c="var(--sr-text-danger)">This cannot be undone.</Text>
        <Text size="sm">AWS KMS can no longer use these keys: every call with the store's credential is refused from the next
          one, health checks included, and AWS KMS shows the store disconnected. Its {s.keys.length} KMS key(s) become
          unusable in AWS, and what they encrypted cannot be decrypted there. The Strongroom keys themselves stay, with
          their audit trail.</Text>
      </TypedConfirmDialog>
      <CredentialDialog issued={issued} onClose={() => setIssued(null)} reissued />
    </Stack>
  );
}

function Prop({ label, children }: { label: string; children: ReactNode }) {
  return <><Text size="sm" c="dimmed">{label}</Text><Text size="sm" component="div" style={{ overflowWrap: "anywhere" }}>{children}</Text></>;
}

function KeysTable({ s, manage, onRemove }: { s: XksStore; manage: boolean; onRemove: (k: XksKey) => void }) {
  if (s.keys.length === 0) {
    return (
      <EmptyState title="No key granted">
        AWS KMS can use no key through this store: creating a KMS key in it fails. Grant a Strongroom AES-256 key under
        the external key id you will give AWS KMS.
      </EmptyState>
    );
  }
  const keys = [...s.keys].sort((a, b) => a.external_id.localeCompare(b.external_id));
  return (
    <Table.ScrollContainer minWidth={640}>
      <Table fz="sm" verticalSpacing={6} highlightOnHover data-testid="xks-keys-table">
        <Table.Thead><Table.Tr>
          <Table.Th>External key id</Table.Th><Table.Th>Key</Table.Th><Table.Th>Last used</Table.Th>
          <Table.Th>Granted</Table.Th>{manage && <Table.Th><span className="sr-only">Remove</span></Table.Th>}
        </Table.Tr></Table.Thead>
        <Table.Tbody>
          {keys.map((k) => (
            <Table.Tr key={k.external_id} data-external-id={k.external_id}>
              <Table.Td><Text size="sm" ff="monospace" fw={600} style={{ overflowWrap: "anywhere" }}>{k.external_id}</Text></Table.Td>
              <Table.Td>
                <Anchor component={Link} to={`/keys/${encodeURIComponent(k.key_uuid)}`} size="sm" fw={600}>{k.key_name}</Anchor>
              </Table.Td>
              <Table.Td title={fmtTime(k.last_used_at)} style={{ whiteSpace: "nowrap" }}>
                {k.last_used_at ? fmtRelative(k.last_used_at) : <Text span size="sm" c="dimmed">never</Text>}</Table.Td>
              <Table.Td title={fmtTime(k.granted_at)} style={{ whiteSpace: "nowrap" }}>
                {fmtRelative(k.granted_at)}<Text size="xs" c="dimmed">by {k.granted_by}</Text></Table.Td>
              {manage && <Table.Td>
                <Button size="compact-sm" variant="subtle" color="red" onClick={() => onRemove(k)}
                        aria-label={`Remove ${k.external_id} (${k.key_name}) from ${s.name}`}>Remove</Button>
              </Table.Td>}
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

/** A key (active AES-256 keys, searched on the server by name) under an external key id. */
function GrantDialog({ s, opened, onClose }: { s: XksStore; opened: boolean; onClose: () => void }) {
  const [keyRef, setKeyRef] = useState<string | null>(null);
  const [search, setSearch] = useState("");
  const [debounced] = useDebouncedValue(search, 250);
  // null until typed in: the key's name, AWS KMS's default external key id.
  const [idText, setIdText] = useState<string | null>(null);
  const keys = useKeys({ q: debounced.trim() || undefined, state: "active", limit: 50, offset: 0, sort: "name" }, opened);
  // What the server grants (keyserver/core/xks.py): an Active AES-256 key. It stays in the HSM.
  const aes = (keys.data?.items ?? []).filter((k) => k.algorithm.toUpperCase() === "AES" && k.length_bits === 256);
  const chosen = aes.find((k) => k.id === keyRef);
  const typedId = (idText ?? chosen?.name ?? "").trim();
  const idError = keyRef ? externalIdError(typedId, s.keys.map((k) => k.external_id)) : null;
  const refresh = useRefresh();
  const grant = useMutation({
    mutationFn: () => xksApi.grant(s.name, { key: keyRef ?? "", external_id: typedId }),
    onSuccess: (k) => {
      refresh();
      notifications.show({ color: "teal", title: "Key granted",
                           message: `AWS KMS can use ${k.key_name} through ${s.name} as external key id ${k.external_id}` });
      close();
    },
  });
  const close = () => { setKeyRef(null); setSearch(""); setIdText(null); grant.reset(); onClose(); };
  const invalid = !keyRef || !!idError;
  return (
    <Modal opened={opened} onClose={close} title={`Grant a key to ${s.name}`} centered size="lg">
      <form aria-label={`Grant a key to ${s.name}`} onSubmit={(e) => { e.preventDefault(); if (!invalid) grant.mutate(); }}>
        <Stack gap="sm">
          <Select label="Key" required searchable placeholder="Type to search keys by name"
                  leftSection={<IconKey size={14} />} data={aes.map((k) => ({ value: k.id, label: k.name }))}
                  value={keyRef} onChange={setKeyRef} searchValue={search} onSearchChange={setSearch}
                  nothingFoundMessage={keys.isFetching ? "Searching…" : "No active AES-256 key by that name"}
                  description={chosen ? `${chosen.algorithm}-${chosen.length_bits} · current version v${chosen.current_version}${chosen.owner ? ` · owner ${chosen.owner}` : ""}`
                    : "Active AES-256 keys: AES-GCM runs in the HSM, the key never leaves it"}
                  error={keys.error ? "Keys could not be loaded: reopen this dialog to try again" : undefined}
                  comboboxProps={{ withinPortal: true }} data-testid="xks-grant-key-select" />
          <TextInput label="External key id" required autoComplete="off" value={idText ?? chosen?.name ?? ""}
                     onChange={(e) => setIdText(e.currentTarget.value)} error={idError}
                     description="The id you give AWS KMS when creating the KMS key in the external key store (default: the key's name)"
                     data-testid="xks-grant-external-id" />
          <Text size="sm" c="dimmed">From its next call, AWS KMS can encrypt and decrypt with every version of this key through
            {" "}{s.name}; each call is audited with the AWS principal and request id.</Text>
          <ErrorAlert error={grant.error} title="Key not granted" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={grant.isPending} disabled={invalid}
                    data-testid="xks-grant-submit">Grant key</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function RemoveKeyDialog({ s, k, onClose }: { s: XksStore; k: XksKey | null; onClose: () => void }) {
  const refresh = useRefresh();
  const remove = useMutation({
    mutationFn: (g: XksKey) => xksApi.remove(s.name, g.external_id),
    onSuccess: (_, g) => {
      refresh();
      notifications.show({ color: "teal", title: "Key removed", message: `AWS KMS can no longer use ${g.key_name} as ${g.external_id}` });
      close();
    },
  });
  const close = () => { remove.reset(); onClose(); };
  return (
    <Modal opened={!!k} onClose={close} title={`Remove ${k?.external_id ?? ""} from ${s.name}`} centered>
      <Stack gap="sm">
        <Text size="sm">From its next call, AWS KMS gets "key not found" for external key id <b>{k?.external_id}</b>: the KMS
          key on it cannot encrypt, and what it encrypted cannot be decrypted, until the id is granted again.</Text>
        <Text size="sm">The Strongroom key <b>{k?.key_name}</b> itself stays. Granting it again under the same external key id
          gives the access back.</Text>
        <ErrorAlert error={remove.error} title="Key not removed" />
        <Group justify="flex-end">
          <Button variant="default" onClick={close}>Cancel</Button>
          <Button color="red" loading={remove.isPending} onClick={() => k && remove.mutate(k)}
                  data-testid="remove-xks-key-confirm">Remove key</Button>
        </Group>
      </Stack>
    </Modal>
  );
}

/** Set, change or clear the client certificate subject the store requires (mutual TLS). */
function MtlsDialog({ s, opened, onClose }: { s: XksStore; opened: boolean; onClose: () => void }) {
  const [text, setText] = useState<string | null>(null);
  const typed = (text ?? s.client_cert_subject ?? "").trim();
  const error = typed ? subjectError(typed) : null;
  const refresh = useRefresh();
  const save = useMutation({
    mutationFn: (subject: string | null) => xksApi.setSubject(s.name, subject),
    onSuccess: (r) => {
      refresh();
      notifications.show({ color: "teal", title: r.client_cert_subject ? "Mutual TLS required" : "Mutual TLS off",
                           message: r.client_cert_subject ? `${s.name} requires ${r.client_cert_subject}` : `${s.name}: SigV4 alone` });
      close();
    },
  });
  const close = () => { setText(null); save.reset(); onClose(); };
  const unchanged = typed.toLowerCase() === (s.client_cert_subject ?? "");
  return (
    <Modal opened={opened} onClose={close} title={`Mutual TLS for ${s.name}`} centered size="lg">
      <form aria-label={`Mutual TLS for ${s.name}`}
            onSubmit={(e) => { e.preventDefault(); if (typed && !error && !unchanged) save.mutate(typed); }}>
        <Stack gap="sm">
          <TextInput label="Required client certificate subject" data-autofocus autoComplete="off" spellCheck={false}
                     placeholder={awsSubjectFor(s.region)} value={text ?? s.client_cert_subject ?? ""} error={error}
                     onChange={(e) => setText(e.currentTarget.value)}
                     description={`Matched exactly (case does not matter) against the certificate's subject CN or a DNS name. AWS KMS's for ${s.region} is ${awsSubjectFor(s.region)}.`}
                     data-testid="xks-mtls-input" />
          {typed && !error && typed.toLowerCase() !== awsSubjectFor(s.region) && (
            <Text size="sm" c="var(--sr-text-warning)" data-testid="xks-mtls-not-aws">
              This is not AWS KMS's subject for {s.region} ({awsSubjectFor(s.region)}): AWS KMS's calls would be refused.
            </Text>
          )}
          <Alert color="orange" variant="light" title="Set it in AWS KMS first">
            Once a subject is required, calls without that certificate are refused with 401, including every call on the REST
            port. Turn the key store's mutual TLS on in AWS KMS and point its proxy URI endpoint at this server's XKS port
            first, then require the subject here.
          </Alert>
          <ErrorAlert error={save.error} title="Mutual TLS not changed" />
          <Group justify="space-between">
            {s.client_cert_subject
              ? <Button variant="outline" color="red" loading={save.isPending && save.variables === null}
                        onClick={() => save.mutate(null)} data-testid="xks-mtls-off">Turn mutual TLS off</Button>
              : <span />}
            <Group gap="xs">
              <Button variant="default" onClick={close}>Cancel</Button>
              <Button type="submit" color="ink" loading={save.isPending && save.variables !== null}
                      disabled={!typed || !!error || unchanged} data-testid="xks-mtls-save">Require this subject</Button>
            </Group>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
