import { Anchor, AppShell, Badge, Box, Burger, Button, Group, NavLink, Stack, Text, UnstyledButton } from "@mantine/core";
import { useDisclosure, useMediaQuery } from "@mantine/hooks";
import { useEffect } from "react";
import { IconLock, IconLogout } from "@tabler/icons-react";
import { Link, Navigate, Outlet, useLocation, useNavigate } from "react-router";
import { SIGNED_OUT, useAuth } from "./auth";
import { Loading } from "./components/bits";
import { GlobalSearch } from "./components/GlobalSearch";
import { NAV, mayOpen } from "./nav";

export function Brand({ light = false }: { light?: boolean }) {
  return (
    <Group gap={8} wrap="nowrap">
      <IconLock size={20} stroke={2} color={light ? "#e6edf7" : "#1b2433"} />
      <Text fw={700} size="md" c={light ? "#e6edf7" : "#1b2433"} style={{ letterSpacing: 0.3 }}>Strongroom</Text>
    </Group>
  );
}

export function Layout() {
  const { me, loading, notice, can, signOut } = useAuth();
  const location = useLocation();
  const navigate = useNavigate();
  // Below the "sm" breakpoint (phones, narrow windows) the navigation folds behind a
  // menu button and closes again once a destination is chosen.
  const [navOpen, nav] = useDisclosure(false);
  const narrow = useMediaQuery("(max-width: 47.99em)"); // below Mantine's "sm"
  const closeNav = nav.close; // stable (useCallback), unlike the handlers object
  useEffect(() => closeNav(), [closeNav, location.pathname, location.search]);
  if (loading) return <Loading label="Checking your session…" />;
  // The whole destination, filters included, survives signing in (a shared audit link);
  // after a sign-out the person asked for, the next sign-in starts afresh. (Signing out
  // clears the session before the button's own navigate runs, so this render comes first.)
  if (!me) return <Navigate to="/sign-in" replace
                            state={notice === SIGNED_OUT ? null : { from: location.pathname + location.search }} />;
  if (me.must_change_password) return <Navigate to="/change-password" replace />;
  const items = NAV.filter((n) => mayOpen(n, can));
  return (
    <AppShell header={{ height: 52 }} padding={{ base: "sm", sm: "lg" }}
              navbar={{ width: 208, breakpoint: "sm", collapsed: { mobile: !navOpen } }}>
      <Anchor href="#main-content" className="skip-link"
              onClick={(e) => { e.preventDefault(); document.getElementById("main-content")?.focus(); }}>
        Skip to content
      </Anchor>
      <AppShell.Header bg="#141b26" style={{ borderBottom: "1px solid #263041" }}>
        <Group h="100%" px="md" justify="space-between" wrap="nowrap">
          <Group gap="xs" wrap="nowrap">
            <Burger opened={navOpen} onClick={nav.toggle} hiddenFrom="sm" size="sm" color="#e6edf7"
                    aria-label={navOpen ? "Close navigation" : "Open navigation"} aria-expanded={navOpen} />
            <UnstyledButton component={Link} to="/" aria-label="Strongroom home"><Brand light /></UnstyledButton>
          </Group>
          <Group gap="sm" wrap="nowrap">
            <GlobalSearch />
            <Anchor component={Link} to="/account" size="sm" c="#c5d0e0" data-testid="whoami" visibleFrom="xs"
                    title="Your account: password and second factor">{me.username}</Anchor>
            <Badge variant="outline" color="gray.4" radius="sm" data-testid="role-badge" style={{ flexShrink: 0 }}>
              {me.role ?? me.actor_type}
            </Badge>
            {/* On a phone the icon alone (its name stays for screen readers). */}
            <Button size="xs" variant="subtle" color="gray.3" leftSection={<IconLogout size={14} />} aria-label="Sign out"
                    px={6} onClick={async () => { await signOut(); navigate("/sign-in"); }}>
              <Box component="span" visibleFrom="xs">Sign out</Box>
            </Button>
          </Group>
        </Group>
      </AppShell.Header>
      {/* Folded away on a phone, its links leave the tab order and the accessibility tree too. */}
      <AppShell.Navbar p="xs" bg="var(--sr-nav-bg)" inert={narrow && !navOpen ? true : undefined}>
        <Stack gap={2} component="nav" aria-label="Main">
          {items.map((n) => {
            const active = n.to === "/" ? location.pathname === "/" : location.pathname.startsWith(n.to);
            return (
              <NavLink key={n.to} component={Link} to={n.to} label={n.label} active={active}
                       leftSection={<n.icon size={16} stroke={1.7} />} variant="filled" color="ink"
                       style={{ borderRadius: 4 }} />
            );
          })}
        </Stack>
        <Box mt="auto" p="xs">
          <Text size="xs" c="dimmed">Times in UTC</Text>
        </Box>
      </AppShell.Navbar>
      <AppShell.Main bg="var(--sr-main-bg)" id="main-content" tabIndex={-1} style={{ outline: "none" }}>
        <Outlet />
      </AppShell.Main>
    </AppShell>
  );
}
