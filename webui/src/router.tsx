import { lazy, Suspense, type ComponentType, type ReactNode } from "react";
import { createHashRouter, Navigate } from "react-router";
import { Layout } from "./Layout";
import { useAuth, type Permission } from "./auth";
import { EmptyState, Loading } from "./components/bits";
import { ChangePasswordPage, SignInPage } from "./pages/SignIn";

// Every page but sign-in is its own chunk, fetched when first opened: the sign-in page
// loads only what it needs (the charts library, for one, comes with the dashboard).
// Made once per page (a lazy component made during render would be fetched and mounted
// again on every render).
function lazyPage<K extends string>(load: () => Promise<Record<K, ComponentType>>, name: K): ComponentType {
  const Page = lazy(async () => ({ default: (await load())[name] as ComponentType<object> }));
  return function LazyPage() {
    return <Suspense fallback={<Loading label="Loading…" />}><Page /></Suspense>;
  };
}
const DashboardPage = lazyPage(() => import("./pages/Dashboard"), "DashboardPage");
const KeysPage = lazyPage(() => import("./pages/Keys"), "KeysPage");
const KeyDetailPage = lazyPage(() => import("./pages/KeyDetail"), "KeyDetailPage");
const HostsPage = lazyPage(() => import("./pages/Hosts"), "HostsPage");
const HostDetailPage = lazyPage(() => import("./pages/HostDetail"), "HostDetailPage");
const GuardPointsPage = lazyPage(() => import("./pages/GuardPoints"), "GuardPointsPage");
const VolumesPage = lazyPage(() => import("./pages/Volumes"), "VolumesPage");
const VolumeDetailPage = lazyPage(() => import("./pages/Volumes"), "VolumeDetailPage");
const AuditPage = lazyPage(() => import("./pages/Audit"), "AuditPage");
const UsersPage = lazyPage(() => import("./pages/Users"), "UsersPage");
const TokensPage = lazyPage(() => import("./pages/Tokens"), "TokensPage");
const SystemPage = lazyPage(() => import("./pages/System"), "SystemPage");
const KmipClientsPage = lazyPage(() => import("./pages/Kmip"), "KmipClientsPage");
const DatabasesPage = lazyPage(() => import("./pages/Databases"), "DatabasesPage");
const DatabaseDetailPage = lazyPage(() => import("./pages/DatabaseDetail"), "DatabaseDetailPage");
const XksStoresPage = lazyPage(() => import("./pages/XksStores"), "XksStoresPage");
const XksStoreDetailPage = lazyPage(() => import("./pages/XksStoreDetail"), "XksStoreDetailPage");
const ApprovalsPage = lazyPage(() => import("./pages/Approvals"), "ApprovalsPage");
const AccountPage = lazyPage(() => import("./pages/Account"), "AccountPage");

function Need({ perm, children }: { perm: Permission; children: ReactNode }) {
  const { can } = useAuth();
  return can(perm) ? <>{children}</> : (
    <EmptyState title="Not available for your role">This page needs the {perm} permission.</EmptyState>
  );
}

// Hash routing: the keyserver serves dist/ as static files without an SPA fallback,
// so deep links must not depend on the server knowing the console's paths.
// Extension point: guard points (issue 5) add routes here and entries in nav.tsx.
export const router = createHashRouter([
  { path: "/sign-in", element: <SignInPage /> },
  { path: "/change-password", element: <ChangePasswordPage /> },
  {
    element: <Layout />,
    children: [
      { index: true, element: <DashboardPage /> },
      { path: "keys", element: <Need perm="keys:read"><KeysPage /></Need> },
      { path: "keys/:keyRef", element: <Need perm="keys:read"><KeyDetailPage /></Need> },
      { path: "hosts", element: <Need perm="hosts:read"><HostsPage /></Need> },
      { path: "hosts/:hostId", element: <Need perm="hosts:read"><HostDetailPage /></Need> },
      { path: "guard-points", element: <Need perm="hosts:read"><GuardPointsPage /></Need> },
      { path: "volumes", element: <Need perm="hosts:read"><VolumesPage /></Need> },
      { path: "volumes/:volumeId", element: <Need perm="hosts:read"><VolumeDetailPage /></Need> },
      { path: "audit", element: <Need perm="audit:read"><AuditPage /></Need> },
      { path: "users", element: <Need perm="users:read"><UsersPage /></Need> },
      { path: "tokens", element: <Need perm="tokens:own"><TokensPage /></Need> },
      { path: "system", element: <Need perm="system:read"><SystemPage /></Need> },
      { path: "kmip-clients", element: <Need perm="kmip:clients"><KmipClientsPage /></Need> },
      { path: "databases", element: <Need perm="databases:read"><DatabasesPage /></Need> },
      { path: "databases/:name", element: <Need perm="databases:read"><DatabaseDetailPage /></Need> },
      { path: "aws-key-stores", element: <Need perm="xks:read"><XksStoresPage /></Need> },
      { path: "aws-key-stores/:name", element: <Need perm="xks:read"><XksStoreDetailPage /></Need> },
      { path: "approvals", element: <ApprovalsPage /> },
      { path: "account", element: <AccountPage /> },
      { path: "*", element: <Navigate to="/" replace /> },
    ],
  },
]);
