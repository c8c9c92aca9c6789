import { Group, Stack, Text, Title } from "@mantine/core";
import type { ReactNode } from "react";

export function PageHeader({ title, subtitle, actions }: { title: ReactNode; subtitle?: ReactNode; actions?: ReactNode }) {
  return (
    // On a phone the actions wrap below the title instead of widening the page.
    <Group justify="space-between" align="flex-end" gap="sm">
      <Stack gap={2} style={{ flex: "1 1 16rem", minWidth: 0 }}>
        <Title order={1} size="h3" fw={650} style={{ overflowWrap: "anywhere" }}>{title}</Title>
        {subtitle && <Text size="sm" c="dimmed">{subtitle}</Text>}
      </Stack>
      {actions && <Group gap="xs">{actions}</Group>}
    </Group>
  );
}
