import { Alert, Button, Group, Modal, Stack, Text, TextInput } from "@mantine/core";
import { useState, type ReactNode } from "react";
import { ErrorAlert } from "./ErrorAlert";

interface Props {
  opened: boolean;
  onClose: () => void;
  title: string;
  /** What must be typed, exactly, to enable the action (e.g. the key's name). */
  phrase: string;
  actionLabel: string;
  children: ReactNode;
  onConfirm: () => void;
  busy?: boolean;
  error?: unknown;
  /** Why the server would refuse right now (the action stays unavailable until it is fixed). */
  blockedBy?: string | null;
  /** A field of the dialog's own holds what the server would refuse (its error is shown under it). */
  invalid?: boolean;
  /** When it changes, what was typed is cleared: a graver action asks for the name again. */
  resetKey?: string;
}

/** An irreversible action that the person confirms by typing the object's name. */
export function TypedConfirmDialog({ opened, onClose, title, phrase, actionLabel, children, onConfirm, busy, error,
                                    blockedBy, invalid, resetKey }: Props) {
  const [typed, setTyped] = useState("");
  const [typedFor, setTypedFor] = useState(resetKey);
  if (typedFor !== resetKey) { setTypedFor(resetKey); setTyped(""); }
  const matches = typed === phrase && !blockedBy && !invalid;
  const close = () => { setTyped(""); onClose(); };
  return (
    <Modal opened={opened} onClose={close} title={title} centered>
      <form onSubmit={(e) => { e.preventDefault(); if (matches && !busy) onConfirm(); }}>
        <Stack gap="sm">
          {children}
          <TextInput
            label={<>Type <Text span ff="monospace" fw={700}>{phrase}</Text> to confirm</>}
            value={typed}
            onChange={(e) => setTyped(e.currentTarget.value)}
            autoComplete="off"
            spellCheck={false}
            data-autofocus
            data-testid="typed-confirm-input"
          />
          {blockedBy && <Alert color="orange" variant="light" data-testid="typed-confirm-blocked">{blockedBy}</Alert>}
          <ErrorAlert error={error} />
          <Group justify="flex-end">
            <Button variant="default" onClick={close}>Cancel</Button>
            <Button type="submit" color="red" disabled={!matches} loading={busy} data-testid="typed-confirm-submit">
              {actionLabel}
            </Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
