import { Table, UnstyledButton } from "@mantine/core";
import { IconArrowDown, IconArrowUp, IconArrowsSort } from "@tabler/icons-react";

/** A sortable column's header: `sort` is the list's current order ("-" first for
 *  descending), as the server takes it; clicking sorts by this column, again reverses. */
export function SortHeader({ label, column, sort, onSort }: { label: string; column: string; sort: string; onSort: (c: string) => void }) {
  const active = sort.replace(/^-/, "") === column;
  const descending = active && sort.startsWith("-");
  const Icon = !active ? IconArrowsSort : descending ? IconArrowDown : IconArrowUp;
  return (
    <Table.Th aria-sort={active ? (descending ? "descending" : "ascending") : "none"}>
      <UnstyledButton onClick={() => onSort(column)} aria-label={`Sort by ${label.toLowerCase()}`}
                      style={{ display: "inline-flex", alignItems: "center", gap: 4, fontWeight: 700, fontSize: "inherit" }}>
        {label}<Icon size={14} stroke={1.8} aria-hidden />
      </UnstyledButton>
    </Table.Th>
  );
}

/** The next order after clicking `column`: ascending first, then descending. */
export const nextSort = (sort: string, column: string) => (sort === column ? `-${column}` : column);
