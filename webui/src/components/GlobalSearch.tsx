// One search box for the whole console (Ctrl+K, or "/"): keys by name, hosts by name,
// group or address, the console's pages, and the audit log's full-text search — each only
// where the signed-in role may read it. The keyboard does everything: arrows move, Enter
// opens, Escape closes.
import { ActionIcon, Badge, Box, Button, Group, Kbd, Modal, Stack, Text, TextInput, UnstyledButton } from "@mantine/core";
import { useDebouncedValue, useHotkeys } from "@mantine/hooks";
import { IconSearch } from "@tabler/icons-react";
import { useEffect, useMemo, useState } from "react";
import { useNavigate } from "react-router";
import { useAuth } from "../auth";
import { NAV, mayOpen } from "../nav";
import { useHostList, useKeys } from "../queries";

const PER_KIND = 5;

interface Hit { id: string; group: string; label: string; hint?: string; to: string }

export function GlobalSearch() {
  const [opened, setOpened] = useState(false);
  useHotkeys([["mod+K", () => setOpened(true)], ["/", () => setOpened(true)]]);
  return (
    <>
      {/* Its name is what it shows (WCAG's label in name): "Search", and the shortcut where there is room. */}
      <Button size="xs" variant="default" leftSection={<IconSearch size={14} />} onClick={() => setOpened(true)}
              title="Search keys, hosts, pages and the audit log" data-testid="global-search-open" visibleFrom="sm"
              styles={{ root: { background: "#1f2937", borderColor: "#374151", color: "#e6edf7" } }}>
        Search
        <Kbd size="xs" ml={8} visibleFrom="md">Ctrl K</Kbd>
      </Button>
      {/* A phone's header has room for the icon only. */}
      <ActionIcon variant="subtle" color="gray.3" hiddenFrom="sm" onClick={() => setOpened(true)} aria-label="Search"
                  data-testid="global-search-open-narrow">
        <IconSearch size={18} />
      </ActionIcon>
      <Modal opened={opened} onClose={() => setOpened(false)} title="Search" size="lg" yOffset="10vh">
        {opened && <SearchPanel close={() => setOpened(false)} />}
      </Modal>
    </>
  );
}

function SearchPanel({ close }: { close: () => void }) {
  const { can } = useAuth();
  const navigate = useNavigate();
  const [text, setText] = useState("");
  const [q] = useDebouncedValue(text.trim(), 200);
  const [active, setActive] = useState(0);
  const keys = useKeys({ q, limit: PER_KIND, offset: 0, sort: "name" }, can("keys:read") && q.length > 0);
  const hosts = useHostList({ q, limit: PER_KIND, offset: 0, sort: "hostname" }, can("hosts:read") && q.length > 0);
  const hits = useMemo<Hit[]>(() => {
    if (!q) return [];
    const lower = q.toLowerCase();
    const out: Hit[] = [];
    for (const k of keys.data?.items ?? []) {
      out.push({ id: `key-${k.id}`, group: "Keys", label: k.name, hint: k.state, to: `/keys/${encodeURIComponent(k.name)}` });
    }
    for (const h of hosts.data?.items ?? []) {
      out.push({ id: `host-${h.id}`, group: "Hosts", label: h.hostname, hint: h.host_group, to: `/hosts/${h.id}` });
    }
    for (const n of NAV.filter((n) => mayOpen(n, can) && n.label.toLowerCase().includes(lower))) {
      out.push({ id: `page-${n.to}`, group: "Pages", label: n.label, to: n.to });
    }
    if (can("audit:read")) {
      out.push({ id: "audit", group: "Audit log", label: `Records holding “${q}”`, hint: "full-text search",
                 to: `/audit?q=${encodeURIComponent(q)}` });
    }
    return out;
  }, [q, keys.data, hosts.data, can]);
  useEffect(() => setActive(0), [q]);
  const go = (hit: Hit | undefined) => {
    if (!hit) return;
    close();
    navigate(hit.to);
  };
  const searching = (keys.isFetching || hosts.isFetching) && q.length > 0;
  let lastGroup = "";
  return (
    <Stack gap="xs">
      <TextInput data-autofocus placeholder="A key, a host, a page, or words in the audit log" value={text}
                 onChange={(e) => setText(e.currentTarget.value)} leftSection={<IconSearch size={16} />}
                 aria-label="Search" data-testid="global-search-input" role="combobox" aria-expanded={hits.length > 0}
                 aria-controls="global-search-results" aria-autocomplete="list"
                 aria-activedescendant={hits[active] ? `gs-${hits[active].id}` : undefined}
                 onKeyDown={(e) => {
                   if (e.key === "ArrowDown") { e.preventDefault(); setActive((a) => Math.min(a + 1, hits.length - 1)); }
                   if (e.key === "ArrowUp") { e.preventDefault(); setActive((a) => Math.max(a - 1, 0)); }
                   if (e.key === "Enter") { e.preventDefault(); go(hits[active]); }
                 }} />
      <Box id="global-search-results" role="listbox" aria-label="Results" data-testid="global-search-results">
        {hits.map((h, i) => {
          const heading = h.group !== lastGroup ? h.group : null;
          lastGroup = h.group;
          return (
            <Box key={h.id}>
              {heading && <Text size="xs" fw={700} c="dimmed" tt="uppercase" mt="xs" mb={2} aria-hidden>{heading}</Text>}
              <UnstyledButton id={`gs-${h.id}`} role="option" aria-selected={i === active} w="100%" px="sm" py={6}
                              onMouseEnter={() => setActive(i)} onClick={() => go(h)} tabIndex={-1}
                              aria-label={`${h.group}: ${h.label}${h.hint ? ` (${h.hint})` : ""}`}
                              style={{ borderRadius: 4, background: i === active ? "var(--mantine-color-default-hover)" : undefined }}>
                <Group justify="space-between" wrap="nowrap">
                  <Text size="sm" truncate>{h.label}</Text>
                  {h.hint && <Badge variant="light" color="gray" size="sm">{h.hint}</Badge>}
                </Group>
              </UnstyledButton>
            </Box>
          );
        })}
      </Box>
      <Text size="xs" c="dimmed" aria-live="polite">
        {!q ? "Type to search. ↑ ↓ to move, Enter to open, Esc to close."
          : searching ? "Searching…" : hits.length === 0 ? "Nothing found that your role may read." : `${hits.length} results`}
      </Text>
    </Stack>
  );
}
