import { createHashRouter, Navigate } from "react-router";
import { Layout } from "./Layout";
import { useAuth, type Permission } from "./auth";
import { EmptyState } from "./components/bits";
import { AuditPage } from "./pages/Audit";
import { DashboardPage } from "./pages/Dashboard";
import { GuardPointsPage } from "./pages/GuardPoints";
import { HostDetailPage } from "./pages/HostDetail";
import { HostsPage } from "./pages/Hosts";
import { KeyDetailPage } from "./pages/KeyDetail";
import { KeysPage } from "./pages/Keys";
import { ChangePasswordPage, SignInPage } from "./pages/SignIn";
import { TokensPage } from "./pages/Tokens";
import { UsersPage } from "./pages/Users";

function Need({ perm, children }: { perm: Permission; children: React.ReactNode }) {
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
      { path: "audit", element: <Need perm="audit:read"><AuditPage /></Need> },
      { path: "users", element: <Need perm="users:read"><UsersPage /></Need> },
      { path: "tokens", element: <Need perm="tokens:own"><TokensPage /></Need> },
      { path: "*", element: <Navigate to="/" replace /> },
    ],
  },
]);
