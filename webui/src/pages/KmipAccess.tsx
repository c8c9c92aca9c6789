// The KMIP page's Groups and Grants views: which clients share which objects, and the grants
// that let a client or group reach objects outside its own group (docs/kmip.md "Tenancy").
import {
  Alert, Anchor, Badge, Button, Checkbox, Group, Modal, Paper, Radio, Select, Stack, Table, Text, TextInput,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { notifications } from "@mantine/notifications";
import { IconKey, IconPlus } from "@tabler/icons-react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link, useSearchParams } from "react-router";
import { api, call, fieldError } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import {
  RIGHTS, kq, kmipApi, objectUidError, parseGrantee, sortRights, toObjectUid, useKmipGrants, useKmipGroups,
  type KmipGrant, type KmipRight,
} from "../kmip";
import { useKeys } from "../queries";

const KMIP_CLIENTS = ["kmip-clients"] as const;
const RIGHT = Object.fromEntries(RIGHTS.map((r) => [r.value, r]));

/** Rights as badges that keep their size in a narrow table (the row scrolls instead). */
export function RightBadges({ rights }: { rights: readonly KmipRight[] }) {
  return (
    <Group gap={4} wrap="nowrap" data-testid="grant-rights">
      {sortRights(rights).map((r) => (
        <Badge key={r} color={RIGHT[r]?.color ?? "gray"} variant="light" radius="sm" title={RIGHT[r]?.help}
               style={{ overflow: "visible", flexShrink: 0 }}>{r}</Badge>
      ))}
    </Group>
  );
}

export function GranteeName({ grantee }: { grantee: string }) {
  const g = parseGrantee(grantee);
  return (
    <Group gap={6} wrap="nowrap">
      <Badge variant="outline" color={g.kind === "group" ? "grape" : "gray"} radius="sm" style={{ overflow: "visible", flexShrink: 0 }}>
        {g.kind}</Badge>
      <Text size="sm" fw={600} ff="monospace">{g.name}</Text>
    </Group>
  );
}

export function GrantTarget({ g }: { g: KmipGrant }) {
  const { can } = useAuth();
  if (g.target_kind === "key") {
    return (
      <Stack gap={0}>
        <Text size="xs" c="dimmed">key</Text>
        {can("keys:read")
          ? <Anchor component={Link} to={`/keys/${encodeURIComponent(g.target)}`} size="sm" fw={600} title={g.target}>{g.target_name}</Anchor>
          : <Text size="sm" fw={600} title={g.target}>{g.target_name}</Text>}
      </Stack>
    );
  }
  return (
    <Stack gap={0}>
      <Text size="xs" c="dimmed">{g.target_kind === "group" ? "every object of group" : "object"}</Text>
      <Text size="sm" fw={600} ff="monospace" title={g.target}>{g.target_name || g.target}</Text>
    </Stack>
  );
}

export function GroupsView({ onGrant }: { onGrant: (group: string) => void }) {
  const { can } = useAuth();
  const groups = useKmipGroups();
  return (
    <Paper withBorder radius="md">
      {groups.error ? <ErrorAlert error={groups.error} title="KMIP groups could not be loaded" />
        : groups.isPending ? <Loading label="Loading KMIP groups…" /> : groups.data.length === 0 ? (
          <EmptyState title="No KMIP groups">A group appears with its first client: each client is in the group named
            at its creation (its own name by default), and sees the objects of that group.</EmptyState>
        ) : (
          <Table.ScrollContainer minWidth={640}>
            <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="kmip-groups-table">
              <Table.Thead><Table.Tr>
                <Table.Th>Group</Table.Th><Table.Th>Clients</Table.Th><Table.Th>Objects</Table.Th>
                {can("kmip:clients") && <Table.Th><span className="sr-only">Actions</span></Table.Th>}
              </Table.Tr></Table.Thead>
              <Table.Tbody>
                {[...groups.data].sort((a, b) => a.name.localeCompare(b.name)).map((g) => (
                  <Table.Tr key={g.name} data-group={g.name}>
                    <Table.Td><Text size="sm" fw={600} ff="monospace">{g.name}</Text></Table.Td>
                    <Table.Td>{g.clients.length ? <Text size="sm" ff="monospace">{g.clients.join(", ")}</Text>
                      : <Text span size="sm" c="dimmed">none: only grants reach its objects</Text>}</Table.Td>
                    <Table.Td>{g.objects}</Table.Td>
                    {can("kmip:clients") && (
                      <Table.Td>
                        <Button size="compact-sm" variant="subtle" color="gray" onClick={() => onGrant(g.name)}
                                aria-label={`Grant access to group ${g.name}`}>Grant access</Button>
                      </Table.Td>
                    )}
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        )}
    </Paper>
  );
}

/** A table of grants; `onRevoke` adds a Revoke button to each row. */
export function GrantsTable({ grants, onRevoke, showTarget = true }: {
  grants: KmipGrant[]; onRevoke?: (g: KmipGrant) => void; showTarget?: boolean;
}) {
  return (
    <Table.ScrollContainer minWidth={showTarget ? 820 : 620}>
      <Table fz="sm" verticalSpacing={8} highlightOnHover data-testid="kmip-grants-table">
        <Table.Thead><Table.Tr>
          <Table.Th>Grantee</Table.Th>{showTarget && <Table.Th>Target</Table.Th>}<Table.Th>Rights</Table.Th>
          <Table.Th>Created</Table.Th>{onRevoke && <Table.Th><span className="sr-only">Actions</span></Table.Th>}
        </Table.Tr></Table.Thead>
        <Table.Tbody>
          {grants.map((g) => (
            <Table.Tr key={g.id} data-grant={g.id}>
              <Table.Td><GranteeName grantee={g.grantee} /></Table.Td>
              {showTarget && <Table.Td><GrantTarget g={g} /></Table.Td>}
              <Table.Td><RightBadges rights={g.rights} /></Table.Td>
              <Table.Td style={{ whiteSpace: "nowrap" }} title={fmtTime(g.created_at)}>
                {fmtRelative(g.created_at)}<Text size="xs" c="dimmed">by {g.created_by}</Text></Table.Td>
              {onRevoke && (
                <Table.Td>
                  <Button size="compact-sm" variant="subtle" color="red" onClick={() => onRevoke(g)}
                          aria-label={`Revoke the grant of ${g.target_name || g.target} to ${parseGrantee(g.grantee).name}`}>Revoke</Button>
                </Table.Td>
              )}
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

/** Every grant, or those of one grantee (`?grantee=client:<name>` or `group:<name>`): after an
 *  upgrade each client holds one on group `shared` (docs/kmip.md "Upgrading"). */
export function GrantsView({ onGrant, onRevoke }: { onGrant: () => void; onRevoke: (g: KmipGrant) => void }) {
  const { can } = useAuth();
  const [params, setParams] = useSearchParams();
  const grantee = params.get("grantee") ?? "";
  const grants = useKmipGrants({ grantee });
  const groups = useKmipGroups();
  const manage = can("kmip:clients");
  const clients = [...new Set((groups.data ?? []).flatMap((g) => g.clients))].sort();
  const options = [
    { group: "Clients", items: clients.map((n) => ({ value: `client:${n}`, label: n })) },
    { group: "Groups", items: (groups.data ?? []).map((g) => g.name).sort().map((n) => ({ value: `group:${n}`, label: n })) },
  ];
  // A grantee named in the link stays choosable even when the lists do not hold it.
  if (grantee && !options.some((o) => o.items.some((i) => i.value === grantee))) {
    options[0].items.unshift({ value: grantee, label: parseGrantee(grantee).name });
  }
  const filter = (v: string | null) => setParams((p) => {
    const next = new URLSearchParams(p);
    if (v) next.set("grantee", v); else next.delete("grantee");
    return next;
  }, { replace: true });
  return (
    <Paper withBorder radius="md">
      <Group justify="space-between" p="md" pb={0} wrap="wrap" align="flex-end">
        <Stack gap="xs" maw={720}>
          <Text size="sm" c="dimmed">A grant lets a client, or every client of a group, reach a key, a standalone object
            or a group's objects beyond its own group. It never adds to what the client's role and key export setting allow.</Text>
          <Select label="Grantee" placeholder="Every client and group" data={options} value={grantee || null} onChange={filter}
                  searchable clearable w={{ base: "100%", xs: 320 }} comboboxProps={{ withinPortal: true }}
                  nothingFoundMessage="No client or group by that name" data-testid="grants-filter" />
        </Stack>
        {manage && <Button color="ink" leftSection={<IconPlus size={16} />} onClick={onGrant}
                           data-testid="grant-kmip-access">Grant access</Button>}
      </Group>
      {grants.error ? <ErrorAlert error={grants.error} title="Grants could not be loaded" />
        : grants.isPending ? <Loading label="Loading grants…" /> : grants.data.length === 0 ? (
          <EmptyState title={grantee ? `No grant to ${parseGrantee(grantee).name}` : "No grants"}>
            {grantee ? "Nothing beyond its own group's objects." : "Each client sees only the objects of its own group."}
          </EmptyState>
        ) : <GrantsTable grants={grants.data} onRevoke={manage ? onRevoke : undefined} />}
    </Paper>
  );
}

export interface GrantPreset { key?: string; object?: string; group?: string }

type TargetKind = "key" | "object" | "group";

/** Grant a client or group rights on one key, one standalone KMIP object (a public or private
 *  key, secret data, a certificate: no managed key, so no key page to start from) or a group's
 *  objects. No route lists standalone objects: the object is named by its unique identifier. */
export function GrantDialog({ opened, preset, onClose }: { opened: boolean; preset: GrantPreset; onClose: () => void }) {
  const { can } = useAuth();
  const qc = useQueryClient();
  const [grantee, setGrantee] = useState<string | null>(null);
  const [kind, setKind] = useState<TargetKind | null>(null);
  const [keyRef, setKeyRef] = useState<string | null>(null);
  const [group, setGroup] = useState<string | null>(null);
  const [objectText, setObjectText] = useState<string | null>(null);
  const [rights, setRights] = useState<string[]>(["read"]);
  const [search, setSearch] = useState("");
  const [debounced] = useDebouncedValue(search, 250);
  const targetKind: TargetKind = kind ?? (preset.group ? "group" : preset.object ? "object" : "key");
  const chosenGroup = group ?? preset.group ?? null;
  const typedObject = objectText ?? preset.object ?? "";
  const objectError = objectUidError(typedObject);
  const chosenObject = objectError ? null : toObjectUid(typedObject);
  const clients = useQuery({ queryKey: KMIP_CLIENTS, queryFn: () => call(api.GET("/api/v1/kmip/clients")), enabled: opened });
  const groups = useKmipGroups(opened);
  const existing = useKmipGrants({}, opened);
  const keys = useKeys({ q: debounced.trim() || undefined, limit: 50, offset: 0, sort: "name" }, opened && targetKind === "key");
  const keyOptions = (keys.data?.items ?? []).map((k) => ({ value: k.id, label: k.name }));
  // The preset key comes by name or id (from a key's page): the search's entry for it once found.
  const presetKey = preset.key ? keyOptions.find((o) => o.value === preset.key || o.label === preset.key)?.value ?? preset.key : null;
  if (presetKey && !keyOptions.some((o) => o.value === presetKey)) keyOptions.unshift({ value: presetKey, label: presetKey });
  const chosenKey = keyRef ?? presetKey;
  const keyLabel = keyOptions.find((o) => o.value === chosenKey)?.label ?? chosenKey ?? "";
  const groupNames = (groups.data ?? []).map((g) => g.name).sort();
  const granteeOptions = [
    { group: "Clients", items: (clients.data ?? []).filter((c) => !c.revoked_at).map((c) => ({ value: `client:${c.name}`, label: c.name })) },
    // A group is a grantee once a client is in it (the server refuses an empty one).
    { group: "Groups (every client of it)", items: (groups.data ?? []).filter((g) => g.clients.length)
      .map((g) => g.name).sort().map((n) => ({ value: `group:${n}`, label: n })) },
  ];
  const target = targetKind === "key" ? chosenKey : targetKind === "object" ? chosenObject : chosenGroup;
  const targetLabel = targetKind === "key" ? keyLabel : targetKind === "object" ? chosenObject ?? "" : chosenGroup ?? "";
  const duplicate = grantee && target ? (existing.data ?? []).find((g) => g.grantee === grantee && g.target_kind === targetKind
    && (g.target === target || g.target_name === targetLabel)) : undefined;
  // A client sees its own group's objects without a grant: say so rather than add a grant that changes nothing.
  const granteeParsed = grantee ? parseGrantee(grantee) : null;
  const ownGroup = targetKind === "group" && granteeParsed && chosenGroup && (granteeParsed.kind === "group"
    ? granteeParsed.name === chosenGroup
    : (groups.data ?? []).find((g) => g.name === chosenGroup)?.clients.includes(granteeParsed.name));
  const rightsError = rights.length === 0 ? "Choose at least one right" : null;
  const invalid = !grantee || !target || !!rightsError || !!duplicate || !!ownGroup;
  const grant = useMutation({
    mutationFn: () => kmipApi.grant({
      grantee: grantee ?? "", rights: sortRights(rights as KmipRight[]),
      ...(targetKind === "key" ? { key: chosenKey ?? "" }
        : targetKind === "object" ? { object: chosenObject ?? "" } : { group: chosenGroup ?? "" }),
    }),
    onSuccess: (g) => {
      void qc.invalidateQueries({ queryKey: kq.grantsAll });
      for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
      notifications.show({ color: "teal", title: "Access granted",
                           message: `${parseGrantee(g.grantee).name}: ${sortRights(g.rights).join(", ")} on ${g.target_name || g.target}` });
      close();
    },
  });
  const close = () => {
    setGrantee(null); setKind(null); setKeyRef(null); setGroup(null); setObjectText(null); setRights(["read"]); setSearch("");
    grant.reset(); onClose();
  };
  const listError = clients.error ?? groups.error;
  return (
    <Modal opened={opened} onClose={close} title="Grant KMIP access" centered size="lg">
      <form aria-label="Grant KMIP access" onSubmit={(e) => { e.preventDefault(); if (!invalid) grant.mutate(); }}>
        <Stack gap="sm">
          {/* Not autofocused: a searchable Select opens its list on focus, over the dialog. */}
          <Select label="Grantee" required searchable data={granteeOptions} value={grantee} onChange={setGrantee}
                  description="A KMIP client, or a group: then every client in it, now and later"
                  placeholder="Choose a client or group" nothingFoundMessage="No client or group by that name"
                  error={listError ? "Clients and groups could not be loaded: reopen this dialog to try again" : undefined}
                  comboboxProps={{ withinPortal: true }} data-testid="grant-grantee" />
          <Radio.Group label="Target" value={targetKind} onChange={(v) => setKind(v as TargetKind)}>
            <Group gap="lg" mt={6}>
              <Radio value="key" label="One key" />
              <Radio value="object" label="One standalone object" />
              <Radio value="group" label="A group's objects" />
            </Group>
          </Radio.Group>
          {targetKind === "key" ? (
            <Select label="Key" required searchable placeholder="Type to search keys by name" leftSection={<IconKey size={14} />}
                    data={keyOptions} value={chosenKey} onChange={setKeyRef} searchValue={search} onSearchChange={setSearch}
                    description="Every version of the key, including those made by later rotations"
                    nothingFoundMessage={keys.isFetching ? "Searching…" : "No key by that name"}
                    error={keys.error ? "Keys could not be loaded: reopen this dialog to try again" : undefined}
                    comboboxProps={{ withinPortal: true }} data-testid="grant-key" />
          ) : targetKind === "object" ? (
            <TextInput label="Object's unique identifier" required value={typedObject} placeholder="0b8e2f5a-4c3d-4e1f-9a7b-6c5d4e3f2a1b"
                       onChange={(e) => setObjectText(e.currentTarget.value)} autoComplete="off" spellCheck={false}
                       description="A public key, private key, secret data or certificate made over KMIP: its creator has the identifier, and the audit log shows it as the object ID of kmip.register and kmip.create_key_pair. A managed key is granted as a key."
                       error={(typedObject.trim() ? objectError : null) ?? fieldError(grant.error, "object")}
                       styles={{ input: { fontFamily: "var(--mantine-font-family-monospace)" } }} data-testid="grant-object" />
          ) : (
            <Select label="Group" required searchable data={groupNames} value={chosenGroup} onChange={setGroup}
                    description="Every object of the group, including those created later"
                    nothingFoundMessage="No group by that name" comboboxProps={{ withinPortal: true }} data-testid="grant-group" />
          )}
          <Checkbox.Group label="Rights" value={rights} onChange={setRights} error={rightsError}
                          description="Lifecycle changes (activate, re-key, attributes) stay with the owner's group">
            <Stack gap={6} mt={6}>
              {RIGHTS.map((r) => {
                const blocked = r.value === "export" && !can("keys:export");
                return (
                  <Checkbox key={r.value} value={r.value} label={r.label} disabled={blocked}
                            description={blocked ? `${r.help}. Granting it needs keys:export, which your role lacks` : r.help} />
                );
              })}
            </Stack>
          </Checkbox.Group>
          {duplicate && (
            <Alert color="orange" variant="light" data-testid="grant-duplicate">
              {granteeParsed?.name} has a grant on {targetLabel} already ({sortRights(duplicate.rights).join(", ")}): revoke
              it first to give other rights.
            </Alert>
          )}
          {ownGroup && (
            <Alert color="orange" variant="light" data-testid="grant-own-group">
              {granteeParsed?.name} {granteeParsed?.kind === "group" ? "is" : "is in"} group {chosenGroup}: its clients see
              that group's objects without a grant.
            </Alert>
          )}
          <ErrorAlert error={grant.error} title="Access not granted" />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="ink" loading={grant.isPending} disabled={invalid} data-testid="grant-kmip-submit">Grant access</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

export function RevokeGrantDialog({ grant, onClose }: { grant: KmipGrant | null; onClose: () => void }) {
  const qc = useQueryClient();
  const revoke = useMutation({
    mutationFn: (g: KmipGrant) => kmipApi.revokeGrant(g.id),
    onSuccess: (_, g) => {
      void qc.invalidateQueries({ queryKey: kq.grantsAll });
      for (const ms of [0, 1200]) setTimeout(() => void qc.invalidateQueries({ queryKey: ["audit"] }), ms);
      notifications.show({ color: "teal", title: "Grant revoked", message: `${parseGrantee(g.grantee).name}: no longer on ${g.target_name || g.target}` });
      close();
    },
  });
  const close = () => { revoke.reset(); onClose(); };
  const who = grant ? parseGrantee(grant.grantee) : null;
  const target = grant ? grant.target_name || grant.target : "";
  return (
    <Modal opened={!!grant} onClose={close} title={`Revoke the grant of ${target} to ${who?.name ?? ""}`} centered>
      <Stack gap="sm">
        {grant && who && (
          <>
            <Text size="sm">From its next request, {who.kind === "group" ? `no client of group ${who.name}` : who.name} can
              use these rights on {grant.target_kind === "group" ? `the objects of group ${target}` : target} through this grant:</Text>
            <RightBadges rights={grant.rights} />
            <Text size="sm">Access through its own group or another grant stays. To the client, an object it may no longer
              see answers as if it did not exist.</Text>
          </>
        )}
        <ErrorAlert error={revoke.error} title="Grant not revoked" />
        <Group justify="flex-end">
          <Button variant="default" onClick={close}>Cancel</Button>
          <Button color="red" loading={revoke.isPending} onClick={() => grant && revoke.mutate(grant)}
                  data-testid="revoke-grant-confirm">Revoke grant</Button>
        </Group>
      </Stack>
    </Modal>
  );
}
