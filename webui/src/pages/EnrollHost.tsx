import {
  Alert, Anchor, Autocomplete, Button, Code, Group, Modal, NumberInput, Stack, Text, Title,
} from "@mantine/core";
import { useDebouncedValue } from "@mantine/hooks";
import { IconAlertTriangle, IconDownload, IconInfoCircle } from "@tabler/icons-react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState, type ReactNode } from "react";
import { Link } from "react-router";
import { CA_PEM_URL, api, call, type EnrollmentInfo, type Schemas } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { CopyValue, fmtRelative, fmtTime } from "../components/bits";
import { HOST_GROUP_RE, hostGroupTag, installCommand } from "../hosts";
import { qk, useEnrollmentInfo, useKeys } from "../queries";

type Created = Schemas["EnrollmentTokenCreated"];

/** "Enroll a host": create a one-time token, then show the installer one-liner with it. */
export function EnrollHostDialog({ opened, onClose, groups }: { opened: boolean; onClose: () => void; groups: string[] }) {
  const [created, setCreated] = useState<Created | null>(null);
  const close = () => { setCreated(null); onClose(); };
  return (
    <Modal opened={opened} onClose={close} title="Enroll a host" centered size={created ? 760 : "lg"}
           closeOnClickOutside={!created} closeOnEscape={!created}>
      {created ? <Instructions created={created} onDone={close} />
        : <TokenForm groups={groups} onCancel={close} onCreated={setCreated} />}
    </Modal>
  );
}

function TokenForm({ groups, onCancel, onCreated }: {
  groups: string[]; onCancel: () => void; onCreated: (c: Created) => void;
}) {
  const qc = useQueryClient();
  const info = useEnrollmentInfo();
  const [group, setGroup] = useState("");
  const [uses, setUses] = useState<number | string>(1);
  const [hours, setHours] = useState<number | string>(24);
  const g = group.trim();
  const groupError = g && !HOST_GROUP_RE.test(g)
    ? "1–64 characters: lower-case letters, digits and . _ - (starting with a letter or digit)" : null;
  const ready = !!g && !groupError && uses !== "" && hours !== "";
  const create = useMutation({
    mutationFn: () => call(api.POST("/api/v1/enrollment-tokens", { body: {
      host_group: g, max_uses: Number(uses), expires_in_hours: Number(hours),
    } })),
    onSuccess: (c) => {
      void qc.invalidateQueries({ queryKey: qk.enrollmentTokens });
      onCreated(c);
    },
  });
  return (
    <form onSubmit={(e) => { e.preventDefault(); if (ready) create.mutate(); }} aria-label="Create an enrollment token">
      <Stack gap="sm">
        <Text size="sm">A one-time token lets new hosts join a host group. Each host then receives the keys
          tagged <Code>{hostGroupTag(g || "<group>")}</Code>.</Text>
        {/* At most 8 suggestions, all in view: a fleet has many groups, typing narrows them,
            and a list that scrolled would be a scrolling region with nothing to focus. */}
        <Autocomplete label="Host group" required data-autofocus placeholder="db-servers" data={groups}
                      limit={8} maxDropdownHeight={400}
                      description="Lower-case letters, digits and . _ -; an existing group or a new one"
                      value={group} onChange={setGroup} error={groupError} maxLength={64}
                      autoComplete="off" spellCheck={false} />
        {g && !groupError && <GroupKeys group={g} />}
        <Group grow align="flex-start">
          <NumberInput label="Uses" description="How many hosts may enroll with it (1–10000)" min={1} max={10_000}
                       allowDecimal={false} allowNegative={false} clampBehavior="strict" value={uses} onChange={setUses} />
          <NumberInput label="Expires after (hours)" description="1–720 (30 days)" min={1} max={720}
                       allowDecimal={false} allowNegative={false} clampBehavior="strict" value={hours} onChange={setHours} />
        </Group>
        {info.data && !info.data.install_command && <AgentPortDisabled />}
        {info.data?.install_command_warning && <LoopbackWarning warning={info.data.install_command_warning} />}
        <ErrorAlert error={create.error} title="Token not created" />
        <Group justify="flex-end">
          <Button variant="default" onClick={onCancel}>Cancel</Button>
          <Button type="submit" color="ink" loading={create.isPending} disabled={!ready}
                  data-testid="create-enrollment-token">Create token</Button>
        </Group>
      </Stack>
    </form>
  );
}

/** How many keys a group's hosts would receive: a group with none is likely a typo. */
function GroupKeys({ group }: { group: string }) {
  const { can } = useAuth();
  const [debounced] = useDebouncedValue(group, 300);
  const keys = useKeys({ tag: hostGroupTag(debounced), limit: 1, offset: 0 }, can("keys:read") && !!debounced);
  // Until the answer for this very group is in, say nothing (not the previous group's count).
  if (!can("keys:read") || !keys.data || keys.isPlaceholderData || debounced !== group) return null;
  const n = keys.data.total;
  return n > 0 ? (
    <Text size="sm" c="dimmed" data-testid="group-keys">
      <Anchor component={Link} to={`/keys?tag=${encodeURIComponent(hostGroupTag(group))}`} size="sm">
        {n} key{n === 1 ? "" : "s"}</Anchor> tagged {hostGroupTag(group)} will be delivered to these hosts.
    </Text>
  ) : (
    <Text size="sm" c="var(--sr-text-warning)" data-testid="group-keys">
      No key is tagged {hostGroupTag(group)} yet: hosts of this group will receive no key until one is.
      Check the spelling if the group already exists.
    </Text>
  );
}

function AgentPortDisabled() {
  return (
    <Alert color="orange" variant="light" icon={<IconAlertTriangle size={18} />} title="The agent port is disabled"
           data-testid="agent-port-disabled">
      Hosts download the installer, enroll and fetch their keys over the agent port, which this key server does
      not open. Set <Code>STRONGROOM_AGENT_ENABLED=true</Code> (the port is <Code>STRONGROOM_AGENT_PORT</Code>,
      8443 by default; set <Code>STRONGROOM_AGENT_PUBLIC_URL</Code> if hosts reach it under another name) and
      restart the key server. A token created now stays valid until it expires.
    </Alert>
  );
}

/** The one-liner would send other hosts to their own loopback: say so before they try. */
function LoopbackWarning({ warning }: { warning: string }) {
  return (
    <Alert color="orange" variant="light" icon={<IconAlertTriangle size={18} />}
           title="Other hosts cannot reach this address" data-testid="install-command-warning">
      {warning}
    </Alert>
  );
}

function Step({ n, title, children }: { n: number; title: string; children: ReactNode }) {
  return (
    <Stack gap={6}>
      <Title order={3} size="h6">{n}. {title}</Title>
      {children}
    </Stack>
  );
}

function Instructions({ created, onDone }: { created: Created; onDone: () => void }) {
  const info = useEnrollmentInfo();
  const t = created.token;
  return (
    <Stack gap="md" data-testid="enroll-instructions">
      <Alert color="yellow" variant="light" icon={<IconAlertTriangle size={18} />} title="Copy the command now">
        The token in it is shown only once and cannot be retrieved later. It lets {t.max_uses === 1 ? "one host"
          : `up to ${t.max_uses} hosts`} join <Code>{t.host_group}</Code> until {fmtTime(t.expires_at)} ({fmtRelative(t.expires_at)}).
      </Alert>
      {info.error ? <ErrorAlert error={info.error} title="The installer command could not be loaded" />
        : info.isPending ? <Text size="sm" c="dimmed" role="status">Loading the installer command…</Text>
        : <InstallSteps info={info.data} secret={created.secret} />}
      <Stack gap={4}>
        <Group gap={4}><Text size="sm" fw={500}>The token alone</Text>
          <Text size="xs" c="dimmed">(for <Code>kms-agent enroll --token</Code> or automation)</Text></Group>
        <Group gap="xs" wrap="nowrap">
          <Code block style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}
                data-testid="enrollment-secret">{created.secret}</Code>
          <CopyValue value={created.secret} label="Copy the token" />
        </Group>
      </Stack>
      <Text size="sm" c="dimmed">
        On the host, the installer creates the host's own key pair (the private key never leaves the host),
        enrolls it with this token and starts the agent. The host then appears in the list and can fetch the
        keys tagged <Code>{hostGroupTag(t.host_group)}</Code>.
      </Text>
      <Group justify="flex-end"><Button color="ink" onClick={onDone} data-testid="enroll-done">I have copied it</Button></Group>
    </Stack>
  );
}

function InstallSteps({ info, secret }: { info: EnrollmentInfo; secret: string }) {
  const command = info.install_command ? installCommand(info.install_command, secret) : null;
  return (
    <Stack gap="md">
      <Step n={1} title="Put the CA certificate on the host">
        <Text size="sm">Save it as <Code>ca.pem</Code> in the directory where you will run the command: curl
          checks with it that it is talking to this key server.</Text>
        <Group gap="xs">
          <Button component="a" href={CA_PEM_URL} download="ca.pem" variant="default" size="xs"
                  leftSection={<IconDownload size={14} />} data-testid="download-ca">
            Download CA certificate (ca.pem)</Button>
          <Group gap={0}><CopyValue value={info.ca_pem} label="Copy the CA certificate (PEM)" />
            <Text size="xs" c="dimmed">or copy the PEM</Text></Group>
        </Group>
        <Text size="sm" fw={500} mt={4}>CA fingerprint (SHA-256)</Text>
        <Group gap="xs" wrap="nowrap">
          <Code block style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}
                data-testid="ca-fingerprint">{info.ca_fingerprint_sha256}</Code>
          <CopyValue value={info.ca_fingerprint_sha256} label="Copy the CA fingerprint" />
        </Group>
        <Text size="xs" c="dimmed">Check it on the host before you trust the file:
          {" "}<Code>openssl x509 -in ca.pem -noout -fingerprint -sha256</Code> must print the same value.</Text>
      </Step>
      <Step n={2} title="Run this on the host, next to ca.pem">
        {info.install_command_warning && <LoopbackWarning warning={info.install_command_warning} />}
        <Text size="sm">As root, or as a user with sudo (the installer asks for it only for the steps that need
          root). The host also needs a Python package index, or <Code>--index-url</Code> for a mirror.</Text>
        {command ? (
          <Group gap="xs" wrap="nowrap">
            <Code block style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }}
                  data-testid="install-command">{command}</Code>
            <CopyValue value={command} label="Copy the command" />
          </Group>
        ) : <AgentPortDisabled />}
        {info.install_url && (
          <Text size="xs" c="dimmed"><IconInfoCircle size={12} style={{ verticalAlign: -1 }} /> The installer is
            {" "}<Code>{info.install_url}</Code> (agent {info.agent_version}); the host must reach that address.</Text>
        )}
      </Step>
    </Stack>
  );
}
