import { MantineProvider } from "@mantine/core";
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { render, screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { ReactElement } from "react";
import { MemoryRouter, Route, Routes, useLocation } from "react-router";
import { describe, expect, it } from "vitest";
import type { Me } from "./api/client";
import { SIGNED_OUT, StaticAuth } from "./auth";
import { Layout } from "./Layout";
import { SignInPage } from "./pages/SignIn";
import { fakeApi } from "./test/fakeApi";
import { meAs } from "./test/render";
import { theme } from "./theme";

function Where() {
  const location = useLocation();
  return <p data-testid="where">{location.pathname + location.search}|{JSON.stringify(location.state)}</p>;
}

function mount(ui: ReactElement, me: Me | null, entry: string | { pathname: string; state: unknown },
               notice: string | null = null) {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } });
  return render(
    <MantineProvider theme={theme} env="test">
      <QueryClientProvider client={qc}>
        <StaticAuth me={me} notice={notice}>
          <MemoryRouter initialEntries={[entry]}>{ui}</MemoryRouter>
        </StaticAuth>
      </QueryClientProvider>
    </MantineProvider>,
  );
}

describe("a link opened signed out", () => {
  it("keeps its whole destination, filters included, through the sign-in page", async () => {
    mount(<Routes><Route path="/sign-in" element={<Where />} />
                  <Route element={<Layout />}><Route path="audit" element={<p>audit</p>} /></Route></Routes>,
          null, "/audit?actor=admin&seq=5");
    expect(await screen.findByTestId("where")).toHaveTextContent('/sign-in|{"from":"/audit?actor=admin&seq=5"}');
  });

  it("is forgotten after a sign-out the person asked for: the next sign-in starts at the dashboard", async () => {
    mount(<Routes><Route path="/sign-in" element={<Where />} />
                  <Route element={<Layout />}><Route path="account" element={<p>account</p>} /></Route></Routes>,
          null, "/account", SIGNED_OUT);
    expect(await screen.findByTestId("where")).toHaveTextContent("/sign-in|null");
  });

  it("lands there after signing in", async () => {
    fakeApi({
      "GET /api/v1/auth/methods": { password: true, oidc: false },
      "POST /api/v1/auth/login": { user: meAs("auditor"), csrf_token: "c", expires_at: "2026-11-24T12:00:00Z" },
    });
    mount(<Routes><Route path="/sign-in" element={<SignInPage />} /><Route path="/audit" element={<Where />} /></Routes>,
          null, { pathname: "/sign-in", state: { from: "/audit?actor=admin&seq=5" } });
    await userEvent.type(screen.getByLabelText(/Username/), "auditor1");
    await userEvent.type(screen.getByLabelText(/^Password/), "a passphrase 123");
    await userEvent.click(screen.getByRole("button", { name: "Sign in" }));
    await waitFor(() => expect(screen.getByTestId("where")).toHaveTextContent("/audit?actor=admin&seq=5|"));
  });
});

describe("the frame", () => {
  it("has a skip link to the content and a menu button that opens the navigation on narrow screens", async () => {
    mount(<Routes><Route element={<Layout />}><Route path="/" element={<p>home</p>} /></Route></Routes>,
          meAs("admin"), "/");
    const skip = screen.getByRole("link", { name: "Skip to content" });
    expect(skip).toHaveAttribute("href", "#main-content");
    expect(document.getElementById("main-content")?.tagName).toBe("MAIN");
    const menu = screen.getByRole("button", { name: "Open navigation" });
    expect(menu).toHaveAttribute("aria-expanded", "false");
    await userEvent.click(menu);
    expect(screen.getByRole("button", { name: "Close navigation" })).toHaveAttribute("aria-expanded", "true");
  });

  it("gives the sign-in page a main landmark and a level-one heading", () => {
    fakeApi({ "GET /api/v1/auth/methods": { password: true, oidc: false } });
    mount(<Routes><Route path="/sign-in" element={<SignInPage />} /></Routes>, null, "/sign-in");
    expect(screen.getByRole("main")).toBeInTheDocument();
    expect(screen.getByRole("heading", { level: 1, name: "Sign in" })).toBeInTheDocument();
  });
});

describe("choosing a password", () => {
  it("says the rule about the username before the server refuses it", async () => {
    const { ChangePasswordPage } = await import("./pages/SignIn");
    mount(<Routes><Route path="/change-password" element={<ChangePasswordPage />} /></Routes>,
          { ...meAs("operator"), must_change_password: true }, "/change-password");
    expect(screen.getByText(/not containing your username \(operator1\)/)).toBeInTheDocument();
    await userEvent.type(document.querySelector<HTMLInputElement>('input[name="new_password"]')!, "my-Operator1-passphrase");
    expect(screen.getByText(/contains your username/)).toBeInTheDocument();
    expect(screen.getByRole("button", { name: "Save password" })).toBeDisabled();
  });
});
