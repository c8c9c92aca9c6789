import { MantineProvider } from "@mantine/core";
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { render } from "@testing-library/react";
import type { ReactElement } from "react";
import { MemoryRouter, Route, Routes } from "react-router";
import type { Me } from "../api/client";
import { StaticAuth } from "../auth";
import { theme } from "../theme";

// As keyserver/core/policy.py's ROLE_PERMISSIONS grants them.
export const ROLE_PERMS: Record<string, string[]> = {
  admin: ["keys:read", "keys:create", "keys:update", "keys:rotate", "keys:activate", "keys:revoke", "keys:destroy",
          "keys:encrypt", "keys:decrypt", "keys:verify", "keys:export", "keys:export-wrapped", "datakeys:generate", "datakeys:decrypt", "audit:read", "audit:verify", "users:read",
          "users:manage", "tokens:own", "tokens:all", "system:read", "system:kek", "kmip:clients", "hosts:read",
          "hosts:enroll", "hosts:revoke", "guardpoints:manage", "volumes:manage", "databases:read", "databases:manage", "xks:read", "xks:manage"],
  "key-officer": ["keys:read", "keys:create", "keys:update", "keys:rotate", "keys:activate", "keys:revoke",
                  "keys:destroy", "keys:encrypt", "keys:decrypt", "keys:verify", "keys:export", "keys:export-wrapped", "datakeys:generate", "datakeys:decrypt", "audit:read",
                  "audit:verify", "tokens:own", "system:read", "hosts:read", "guardpoints:manage", "volumes:manage",
                  "databases:read", "databases:manage", "xks:read", "xks:manage"],
  operator: ["keys:read", "keys:rotate", "keys:encrypt", "keys:decrypt", "keys:verify", "keys:export", "keys:export-wrapped", "datakeys:generate", "datakeys:decrypt", "tokens:own",
             "system:read", "hosts:read", "hosts:enroll", "hosts:revoke"],
  auditor: ["keys:read", "keys:verify", "audit:read", "audit:verify", "users:read", "tokens:own", "system:read", "hosts:read",
            "databases:read", "xks:read"],
};

export function meAs(role: keyof typeof ROLE_PERMS): Me {
  return { username: `${role}1`, actor_type: "user", role, permissions: ROLE_PERMS[role], must_change_password: false };
}

/**
 * `ui` with a signed-in identity, a fresh query cache and a router. With `path` (a route
 * pattern such as "/hosts/:hostId") and `at` (the URL), `ui` is that route's element.
 */
export function renderWith(ui: ReactElement, { me = meAs("admin") as Me | null, at = "/", path = undefined as string | undefined } = {}) {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false }, mutations: { retry: false } } });
  return render(
    <MantineProvider theme={theme} env="test">
      <QueryClientProvider client={qc}>
        <StaticAuth me={me}>
          <MemoryRouter initialEntries={[at]}>
            {path ? <Routes><Route path={path} element={ui} /><Route path="*" element={<p>elsewhere</p>} /></Routes> : ui}
          </MemoryRouter>
        </StaticAuth>
      </QueryClientProvider>
    </MantineProvider>,
  );
}
