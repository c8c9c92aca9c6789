// The signed-in person's own account: who they are, their password, and their second
// factor (RFC 6238 TOTP): set up by scanning a QR code, confirmed with a first code, reset
// only by an administrator.
import { Anchor, Box, Button, Code, Group, PinInput, Stack, Table, Text } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { useMutation } from "@tanstack/react-query";
import { QRCodeSVG } from "qrcode.react";
import { useState } from "react";
import { Link } from "react-router";
import { api, call } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { PageHeader } from "../components/PageHeader";
import { Panel } from "../components/Panel";
import { CopyValue } from "../components/bits";

export function AccountPage() {
  const { me } = useAuth();
  if (!me) return null;
  return (
    <Stack gap="md">
      <PageHeader title="Your account" subtitle="Your sign-in: password and second factor." />
      <Panel title="Identity">
        <Table.ScrollContainer minWidth={0}>
          <Table fz="sm" verticalSpacing={4} withRowBorders={false}>
            <Table.Tbody>
              <Table.Tr><Table.Td c="dimmed" w={160}>Username</Table.Td><Table.Td>{me.username}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">Role</Table.Td><Table.Td>{me.role ?? me.actor_type}</Table.Td></Table.Tr>
              <Table.Tr><Table.Td c="dimmed">Password</Table.Td>
                <Table.Td><Anchor component={Link} to="/change-password">Change your password</Anchor></Table.Td></Table.Tr>
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      </Panel>
      <Panel title="Second factor">
        {me.second_factor == null ? (
          <Text size="sm">Only local accounts have a second factor here; single sign-on accounts use the provider's.</Text>
        ) : me.second_factor ? (
          <Text size="sm" data-testid="totp-on">
            <b>On.</b> Signing in asks for your authenticator's 6-digit code after your password. Lost the device? An
            administrator can reset it (Users), and you set up a new one here.
          </Text>
        ) : <TotpSetup />}
      </Panel>
    </Stack>
  );
}

function TotpSetup() {
  const { refresh } = useAuth();
  const [code, setCode] = useState("");
  const start = useMutation({ mutationFn: () => call(api.POST("/api/v1/auth/totp")) });
  const confirm = useMutation({
    mutationFn: () => call(api.POST("/api/v1/auth/totp/confirm", { body: { code } })),
    onSuccess: async () => {
      notifications.show({ color: "teal", title: "Second factor on", message: "From your next sign-in, the authenticator's code is asked for." });
      await refresh();
    },
  });
  if (!start.data) {
    return (
      <Stack gap="xs" align="flex-start">
        <Text size="sm">
          <b>Off.</b> A second factor keeps your account closed to someone who learns your password: an authenticator app
          (any that follows RFC 6238 — Google Authenticator, Microsoft Authenticator, FreeOTP, 1Password…) gives a new
          6-digit code every 30 seconds.
        </Text>
        {start.error != null && <ErrorAlert error={start.error} />}
        <Button color="ink" onClick={() => start.mutate()} loading={start.isPending} data-testid="totp-start">
          Set up an authenticator
        </Button>
      </Stack>
    );
  }
  return (
    <Stack gap="sm" data-testid="totp-setup">
      <Text size="sm">1. Scan this code with your authenticator app, or type the key below into it.</Text>
      <Group align="flex-start" gap="lg">
        <Box p="xs" bg="white" style={{ borderRadius: 4, lineHeight: 0 }}>
          <QRCodeSVG value={start.data.otpauth_uri} size={168} role="img"
                     aria-label="QR code of your authenticator key (the same key is written next to it)" />
        </Box>
        <Stack gap={4}>
          <Text size="xs" c="dimmed">Key (shown this once)</Text>
          <Group gap={2} wrap="nowrap">
            <Code fz="sm" data-testid="totp-secret">{start.data.secret}</Code>
            <CopyValue value={start.data.secret} label="Copy the key" />
          </Group>
          <Text size="xs" c="dimmed">Time-based, 6 digits, every 30 seconds (SHA-1)</Text>
        </Stack>
      </Group>
      <Text size="sm">2. Type the code the app shows now. Until you do, your password alone still signs you in.</Text>
      <PinInput length={6} type="number" oneTimeCode value={code} onChange={setCode} aria-label="Authenticator code"
                data-testid="totp-code" />
      {confirm.error != null && <ErrorAlert error={confirm.error} />}
      <Group>
        <Button color="ink" disabled={code.length !== 6} loading={confirm.isPending} onClick={() => confirm.mutate()}
                data-testid="totp-confirm">Turn on</Button>
      </Group>
    </Stack>
  );
}
