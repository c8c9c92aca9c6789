import { Alert, Button, Code, Group, Modal, Stack, Text } from "@mantine/core";
import { IconAlertTriangle } from "@tabler/icons-react";
import { CopyValue } from "./bits";

/** A secret the server shows exactly once (one-time password, API token). */
export function SecretOnce({ opened, title, label, secret, note, onClose }: {
  opened: boolean; title: string; label: string; secret: string | null; note?: string; onClose: () => void;
}) {
  return (
    <Modal opened={opened && !!secret} onClose={onClose} title={title} centered size="lg"
           closeOnClickOutside={false} closeOnEscape={false}>
      <Stack gap="sm">
        <Alert color="yellow" variant="light" icon={<IconAlertTriangle size={18} />}>
          Copy it now: it is shown only once and cannot be retrieved later.
        </Alert>
        <Text size="sm" fw={500}>{label}</Text>
        <Group gap="xs" wrap="nowrap">
          <Code block style={{ flex: 1, wordBreak: "break-all", whiteSpace: "pre-wrap" }} data-testid="secret-value">{secret}</Code>
          <CopyValue value={secret ?? ""} label="Copy to clipboard" />
        </Group>
        {note && <Text size="sm" c="dimmed">{note}</Text>}
        <Group justify="flex-end"><Button color="ink" onClick={onClose}>I have stored it</Button></Group>
      </Stack>
    </Modal>
  );
}
