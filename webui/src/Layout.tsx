import { AppShell, Badge, Box, Button, Group, NavLink, Stack, Text, UnstyledButton } from "@mantine/core";
import { IconLock, IconLogout } from "@tabler/icons-react";
import { Link, Navigate, Outlet, useLocation, useNavigate } from "react-router";
import { useAuth } from "./auth";
import { Loading } from "./components/bits";
import { NAV } from "./nav";

export function Brand({ light = false }: { light?: boolean }) {
  return (
    <Group gap={8} wrap="nowrap">
      <IconLock size={20} stroke={2} color={light ? "#e6edf7" : "#1b2433"} />
      <Text fw={700} size="md" c={light ? "#e6edf7" : "#1b2433"} style={{ letterSpacing: 0.3 }}>Strongroom</Text>
    </Group>
  );
}

export function Layout() {
  const { me, loading, can, signOut } = useAuth();
  const location = useLocation();
  const navigate = useNavigate();
  if (loading) return <Loading label="Checking your session…" />;
  if (!me) return <Navigate to="/sign-in" replace state={{ from: location.pathname }} />;
  if (me.must_change_password) return <Navigate to="/change-password" replace />;
  const items = NAV.filter((n) => !n.perm || can(n.perm));
  return (
    <AppShell header={{ height: 52 }} navbar={{ width: 208, breakpoint: 0 }} padding="lg">
      <AppShell.Header bg="#141b26" style={{ borderBottom: "1px solid #263041" }}>
        <Group h="100%" px="md" justify="space-between">
          <UnstyledButton component={Link} to="/" aria-label="Strongroom home"><Brand light /></UnstyledButton>
          <Group gap="sm">
            <Text size="sm" c="#c5d0e0" data-testid="whoami">{me.username}</Text>
            <Badge variant="outline" color="gray.4" radius="sm" data-testid="role-badge">{me.role ?? me.actor_type}</Badge>
            <Button size="xs" variant="subtle" color="gray.3" leftSection={<IconLogout size={14} />}
                    onClick={async () => { await signOut(); navigate("/sign-in"); }}>
              Sign out
            </Button>
          </Group>
        </Group>
      </AppShell.Header>
      <AppShell.Navbar p="xs" bg="#f6f7f9">
        <Stack gap={2} component="nav" aria-label="Main">
          {items.map((n) => {
            const active = n.to === "/" ? location.pathname === "/" : location.pathname.startsWith(n.to);
            return (
              <NavLink key={n.to} component={Link} to={n.to} label={n.label} active={active}
                       leftSection={<n.icon size={16} stroke={1.7} />} variant="filled" color="dark"
                       style={{ borderRadius: 4 }} />
            );
          })}
        </Stack>
        <Box mt="auto" p="xs">
          <Text size="xs" c="dimmed">Times in UTC</Text>
        </Box>
      </AppShell.Navbar>
      <AppShell.Main bg="#fbfbfc">
        <Outlet />
      </AppShell.Main>
    </AppShell>
  );
}
