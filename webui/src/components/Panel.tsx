import { Group, Paper, Title } from "@mantine/core";
import type { ReactNode } from "react";

/** A dashboard card: a titled, bordered box with an optional control on the right. */
export function Panel({ title, children, right }: { title: string; children: ReactNode; right?: ReactNode }) {
  return (
    <Paper withBorder radius="md" p="md" h="100%">
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h5">{title}</Title>
        {right}
      </Group>
      {children}
    </Paper>
  );
}
