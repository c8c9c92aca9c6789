import { MantineProvider } from "@mantine/core";
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { render } from "@testing-library/react";
import type { ReactElement } from "react";
import { MemoryRouter } from "react-router";
import type { Me } from "../api/client";
import { StaticAuth } from "../auth";
import { theme } from "../theme";

export const ROLE_PERMS: Record<string, string[]> = {
  admin: ["keys:read", "keys:create", "keys:update", "keys:rotate", "keys:activate", "keys:revoke", "keys:destroy",
          "audit:read", "audit:verify", "users:read", "users:manage", "tokens:own", "tokens:all", "system:read",
          "guardpoints:manage"],
  operator: ["keys:read", "keys:rotate", "datakeys:generate", "datakeys:decrypt", "tokens:own", "system:read"],
  auditor: ["keys:read", "audit:read", "audit:verify", "users:read", "tokens:own", "system:read"],
};

export function meAs(role: keyof typeof ROLE_PERMS): Me {
  return { username: `${role}1`, actor_type: "user", role, permissions: ROLE_PERMS[role], must_change_password: false };
}

export function renderWith(ui: ReactElement, { me = meAs("admin") as Me | null } = {}) {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false }, mutations: { retry: false } } });
  return render(
    <MantineProvider theme={theme}>
      <QueryClientProvider client={qc}>
        <StaticAuth me={me}>
          <MemoryRouter>{ui}</MemoryRouter>
        </StaticAuth>
      </QueryClientProvider>
    </MantineProvider>,
  );
}
