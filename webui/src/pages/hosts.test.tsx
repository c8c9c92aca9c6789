import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { EnrollmentInfo, EnrollmentToken, Host, Key } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { hostPage } from "../test/hostPage";
import { meAs, renderWith } from "../test/render";
import { hostStatus, installCommand, tokenState } from "../hosts";
import { HostsSummary, hostAttention } from "./Dashboard";
import { HostDetailPage } from "./HostDetail";
import { KeyDetailPage } from "./KeyDetail";
import { HostsPage } from "./Hosts";

const ago = (seconds: number) => new Date(Date.now() - seconds * 1000).toISOString();
const inHours = (hours: number) => new Date(Date.now() + hours * 3_600_000).toISOString();

function host(over: Partial<Host>): Host {
  return {
    id: "11111111-1111-4111-8111-111111111111", hostname: "db-01.prod.example.com", host_group: "db", os: "Debian 13",
    agent_version: "0.4.0", cert_serial: "5A1F00C3D2", state: "active", enrolled_at: ago(86_400 * 3),
    last_heartbeat_at: ago(12), revoked_at: null, last_seen_ip: "10.0.4.21", online: true,
    guard_points: [{ path: "/srv/pgdata", key: "payments-db", state: "mounted", detail: "" }], ...over,
  };
}

const HOSTS: Host[] = [
  host({}),
  host({ id: "22222222-2222-4222-8222-222222222222", hostname: "db-02.prod.example.com", online: false,
         last_heartbeat_at: ago(7200),
         guard_points: [{ path: "/srv/a", key: "payments-db", state: "mounted", detail: "" },
                        { path: "/srv/b", key: "ledger", state: "error", detail: "key ledger: forbidden" }] }),
  host({ id: "33333333-3333-4333-8333-333333333333", hostname: "web-01.example.com", host_group: "web",
         online: false, last_heartbeat_at: null, guard_points: [] }),
  host({ id: "44444444-4444-4444-8444-444444444444", hostname: "old-db.example.com", state: "revoked",
         online: false, revoked_at: ago(600) }),
];

function token(over: Partial<EnrollmentToken>): EnrollmentToken {
  return {
    id: "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", prefix: "sre_abcdefgh", host_group: "db", max_uses: 3, uses: 1,
    created_by: "admin1", created_at: ago(3600), expires_at: inHours(23), revoked_at: null, ...over,
  };
}

const TOKENS: EnrollmentToken[] = [
  token({}),
  token({ id: "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb", prefix: "sre_usedupxx", max_uses: 1, uses: 1 }),
  token({ id: "cccccccc-cccc-4ccc-8ccc-cccccccccccc", prefix: "sre_expiredx", uses: 0, expires_at: ago(60) }),
  token({ id: "dddddddd-dddd-4ddd-8ddd-dddddddddddd", prefix: "sre_revokedx", revoked_at: ago(30) }),
];

const INFO: EnrollmentInfo = {
  agent_url: "https://keys.example.com:8443", install_url: "https://keys.example.com:8443/install.sh",
  ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
  ca_fingerprint_sha256: "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89",
  agent_version: "0.4.0",
  install_command: "curl -fsS --cacert ca.pem https://keys.example.com:8443/install.sh | sh -s -- --token TOKEN",
  install_command_warning: null,
};

const SECRET = "sre_newtoken1_Zm9vYmFyLWJhei1xdXV4LXNlY3JldC12YWx1ZQ";

function key(name: string, over: Partial<Key> = {}): Key {
  return {
    id: `${name}-id`, name, description: "", owner: "admin", tags: { "host-group": "db" }, algorithm: "AES",
    length_bits: 256, state: "active", current_version: 2, created_at: ago(86_400), updated_at: ago(3600),
    rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null, versions: [], ...over,
  };
}

const page = <T,>(items: T[]) => ({ items, total: items.length, limit: 50, offset: 0 });

describe("host and token rules", () => {
  it("a host is revoked, else online or offline as the server says", () => {
    expect(hostStatus({ state: "revoked", online: true })).toBe("revoked");
    expect(hostStatus({ state: "active", online: true })).toBe("online");
    expect(hostStatus({ state: "active", online: false })).toBe("offline");
  });

  it("a token is revoked before used up before expired", () => {
    expect(TOKENS.map((t) => tokenState(t))).toEqual(["active", "used up", "expired", "revoked"]);
    expect(tokenState(token({ revoked_at: ago(1), uses: 3, expires_at: ago(5) }))).toBe("revoked");
    expect(tokenState(token({ uses: 3, expires_at: ago(5) }))).toBe("used up");
  });

  it("the token replaces the one-liner's TOKEN placeholder only", () => {
    expect(installCommand(INFO.install_command as string, SECRET)).toBe(
      `curl -fsS --cacert ca.pem https://keys.example.com:8443/install.sh | sh -s -- --token ${SECRET}`);
    expect(installCommand("curl https://TOKEN.example/install.sh | sh -s -- --token TOKEN", "sre_x_y"))
      .toBe("curl https://TOKEN.example/install.sh | sh -s -- --token sre_x_y");
  });
});

describe("Hosts page", () => {
  it("lists every host with its status, last heartbeat, group and guard points", async () => {
    const server = fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": TOKENS });
    renderWith(<HostsPage />, { at: "/hosts", path: "/hosts" });
    const table = await screen.findByTestId("hosts-table");
    const rows = within(table).getAllByRole("row").slice(1);
    expect(rows.map((r) => r.getAttribute("data-host"))).toEqual(HOSTS.map((h) => h.hostname));
    const status = (name: string) => table.querySelector(`[data-host="${name}"] [data-status]`)?.textContent;
    expect(status("db-01.prod.example.com")).toBe("Online");
    expect(status("db-02.prod.example.com")).toBe("Offline");
    expect(status("old-db.example.com")).toBe("Revoked");
    const db2 = within(rows[1]);
    expect(db2.getByText("2 hours ago")).toBeInTheDocument();
    expect(db2.getByText("1 in error")).toBeInTheDocument();
    expect(within(rows[2]).getByText("never (awaiting the first)")).toBeInTheDocument();
    expect(within(rows[0]).getByRole("link", { name: "db-01.prod.example.com" }))
      .toHaveAttribute("href", `/hosts/${HOSTS[0].id}`);
    expect(screen.getByRole("radio", { name: "Offline (2)" })).toBeInTheDocument();
    expect(server.unmatched).toEqual([]);
  });

  it("filters by status and group from the URL, and by search", async () => {
    fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": [] });
    renderWith(<HostsPage />, { at: "/hosts?status=offline&group=db", path: "/hosts" });
    const table = await screen.findByTestId("hosts-table");
    expect([...table.querySelectorAll("tbody tr")].map((r) => r.getAttribute("data-host")))
      .toEqual(["db-02.prod.example.com"]);
    await userEvent.click(screen.getByRole("button", { name: "Clear filters" }));
    await waitFor(() => expect(table.querySelectorAll("tbody tr")).toHaveLength(4));
    await userEvent.type(screen.getByLabelText("Search"), "web-");
    await waitFor(() => expect([...table.querySelectorAll("tbody tr")].map((r) => r.getAttribute("data-host")))
      .toEqual(["web-01.example.com"]));
    await userEvent.type(screen.getByLabelText("Search"), "nothing");
    expect(await screen.findByText("No host matches these filters")).toBeInTheDocument();
  });

  it("asks the server to search, sort and page, and keeps it all in the URL", async () => {
    const server = fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": [] });
    renderWith(<HostsPage />, { at: "/hosts", path: "/hosts" });
    await screen.findByTestId("hosts-table");
    await userEvent.click(screen.getByRole("button", { name: "Sort by last heartbeat" }));
    await waitFor(() => expect(server.calls("GET /api/v1/hosts").at(-1)?.url.searchParams.get("sort"))
      .toBe("last_heartbeat_at"));
    await userEvent.click(screen.getByRole("button", { name: "Sort by last heartbeat" }));
    await waitFor(() => expect(server.calls("GET /api/v1/hosts").at(-1)?.url.searchParams.get("sort"))
      .toBe("-last_heartbeat_at"));
    expect(screen.getByRole("columnheader", { name: /Last heartbeat/ })).toHaveAttribute("aria-sort", "descending");
    await userEvent.type(screen.getByLabelText("Search"), "10.0.4");
    await waitFor(() => expect(server.calls("GET /api/v1/hosts").at(-1)?.url.searchParams.get("q")).toBe("10.0.4"));
    // The status tabs count what the search found, from the server's counts.
    expect(await screen.findByRole("radio", { name: /^All \(\d+\)$/ })).toBeInTheDocument();
  });

  it("with no host yet, explains how to enroll the first one", async () => {
    fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage([], url), "GET /api/v1/enrollment-tokens": [] });
    renderWith(<HostsPage />, { me: meAs("operator") });
    const empty = await screen.findByTestId("no-hosts");
    expect(empty).toHaveTextContent("No hosts enrolled yet");
    expect(empty).toHaveTextContent("run the installer one-liner on the host as root");
    expect(within(empty).getByRole("button", { name: "Enroll the first host" })).toBeEnabled();
  });

  it("an auditor reads hosts and tokens but is offered no enroll or revoke", async () => {
    fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage([], url), "GET /api/v1/enrollment-tokens": TOKENS });
    renderWith(<HostsPage />, { me: meAs("auditor") });
    expect(await screen.findByTestId("no-hosts")).toHaveTextContent("needs the hosts:enroll permission");
    expect(screen.queryByRole("button", { name: /Enroll/ })).toBeNull();
    await screen.findByTestId("enrollment-tokens-table");
    expect(screen.queryByRole("button", { name: /Revoke/ })).toBeNull();
  });

  it("an API failure is shown with its detail and what to do", async () => {
    fakeApi({
      "GET /api/v1/hosts": () => problem(503, "database_unavailable", "the database is not reachable"),
      "GET /api/v1/enrollment-tokens": [],
    });
    renderWith(<HostsPage />);
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("Hosts could not be loaded");
    expect(alert).toHaveTextContent("the database is not reachable");
    expect(alert).toHaveTextContent("retry shortly");
  });
});

describe("Enrollment tokens", () => {
  it("shows active tokens, the others on request, each with its state", async () => {
    fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": TOKENS });
    renderWith(<HostsPage />);
    const table = await screen.findByTestId("enrollment-tokens-table");
    expect([...table.querySelectorAll("tbody tr")].map((r) => r.getAttribute("data-token"))).toEqual(["sre_abcdefgh"]);
    expect(within(table).getByText("1 / 3")).toBeInTheDocument();
    await userEvent.click(screen.getByLabelText("Show used, expired and revoked (3)"));
    expect([...table.querySelectorAll("tbody [data-state]")].map((b) => b.textContent))
      .toEqual(["active", "used up", "expired", "revoked"]);
    // Only an active token can be revoked.
    expect(within(table).getAllByRole("button", { name: /Revoke enrollment token/ })).toHaveLength(1);
  });

  it("revokes a token after confirmation, and says hosts already enrolled stay", async () => {
    const server = fakeApi({
      "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": TOKENS,
      "DELETE /api/v1/enrollment-tokens/:id": ({ params }) => ({ ...TOKENS[0], id: params.id, revoked_at: ago(0) }),
    });
    renderWith(<HostsPage />, { me: meAs("operator") });
    await userEvent.click(await screen.findByRole("button", { name: "Revoke enrollment token sre_abcdefgh" }));
    const dialog = await screen.findByRole("dialog", { name: "Revoke enrollment token sre_abcdefgh…" });
    expect(dialog).toHaveTextContent("2 of its 3 uses are left");
    expect(dialog).toHaveTextContent("Hosts that already enrolled with it keep working");
    expect(server.calls("DELETE /api/v1/enrollment-tokens/:id")).toHaveLength(0);
    await userEvent.click(within(dialog).getByRole("button", { name: "Revoke token" }));
    await waitFor(() => expect(server.calls("DELETE /api/v1/enrollment-tokens/:id").map((c) => c.params.id))
      .toEqual([TOKENS[0].id]));
    await waitFor(() => expect(screen.queryByRole("dialog")).toBeNull());
  });
});

describe("Enroll a host", () => {
  function enrollServer(info: EnrollmentInfo | Response = INFO) {
    return fakeApi({
      "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url), "GET /api/v1/enrollment-tokens": [],
      "GET /api/v1/enrollment-info": () => info,
      "GET /api/v1/keys": ({ url }) => page(url.searchParams.get("tag") === "host-group=db" ? [key("payments-db")] : []),
      "POST /api/v1/enrollment-tokens": ({ body }) => json(201, {
        secret: SECRET,
        token: token({ ...(body as object), prefix: "sre_newtoken1", uses: 0, expires_at: inHours(48) }),
      }),
    });
  }

  it("creates a token and shows the exact one-liner, the CA and its fingerprint, once", async () => {
    const user = userEvent.setup();
    const server = enrollServer();
    renderWith(<HostsPage />, { me: meAs("operator") });
    await user.click(await screen.findByRole("button", { name: "Enroll a host" }));
    const dialog = await screen.findByRole("dialog", { name: "Enroll a host" });
    const group = within(dialog).getByRole("textbox", { name: /Host group/ });
    expect(group).toHaveFocus();
    await user.type(group, "db");
    expect(await within(dialog).findByTestId("group-keys")).toHaveTextContent("1 key tagged host-group=db will be delivered");
    await user.clear(within(dialog).getByLabelText(/^Uses/));
    await user.type(within(dialog).getByLabelText(/^Uses/), "5");
    await user.clear(within(dialog).getByLabelText(/Expires after/));
    await user.type(within(dialog).getByLabelText(/Expires after/), "48{Enter}");

    const command = await within(dialog).findByTestId("install-command");
    expect(server.calls("POST /api/v1/enrollment-tokens").map((c) => c.body))
      .toEqual([{ host_group: "db", max_uses: 5, expires_in_hours: 48 }]);
    expect(command).toHaveTextContent(
      `curl -fsS --cacert ca.pem https://keys.example.com:8443/install.sh | sh -s -- --token ${SECRET}`);
    expect(command.textContent).not.toContain("TOKEN");
    expect(within(dialog).queryByTestId("install-command-warning")).toBeNull();
    expect(dialog).toHaveTextContent("shown only once");
    expect(dialog).toHaveTextContent("up to 5 hosts");
    expect(within(dialog).getByTestId("ca-fingerprint")).toHaveTextContent(INFO.ca_fingerprint_sha256);
    const download = within(dialog).getByRole("link", { name: /Download CA certificate \(ca\.pem\)/ });
    expect(download).toHaveAttribute("href", "/ca.pem");
    expect(dialog).toHaveTextContent("Save it as ca.pem in the directory where you will run the command");
    await user.click(within(dialog).getByRole("button", { name: "Copy the command" }));
    expect(await navigator.clipboard.readText()).toBe(command.textContent);
    await user.click(within(dialog).getByRole("button", { name: "Copy the CA fingerprint" }));
    expect(await navigator.clipboard.readText()).toBe(INFO.ca_fingerprint_sha256);
    // Escape does not lose the secret by accident; the explicit button closes.
    await user.keyboard("{Escape}");
    expect(screen.getByRole("dialog", { name: "Enroll a host" })).toBeInTheDocument();
    await user.click(within(dialog).getByRole("button", { name: "I have copied it" }));
    await waitFor(() => expect(screen.queryByRole("dialog")).toBeNull());
  });

  it("refuses a malformed group or an empty count before asking the server, and warns of a group without keys", async () => {
    const server = enrollServer();
    renderWith(<HostsPage />);
    await userEvent.click(await screen.findByRole("button", { name: "Enroll a host" }));
    const dialog = await screen.findByRole("dialog", { name: "Enroll a host" });
    const group = within(dialog).getByRole("textbox", { name: /Host group/ });
    await userEvent.type(group, "DB Servers");
    expect(within(dialog).getByText(/lower-case letters, digits and \. _ - \(starting/)).toBeInTheDocument();
    expect(within(dialog).getByTestId("create-enrollment-token")).toBeDisabled();
    await userEvent.clear(group);
    await userEvent.type(group, "web");
    expect(await within(dialog).findByTestId("group-keys")).toHaveTextContent("No key is tagged host-group=web yet");
    expect(within(dialog).getByTestId("create-enrollment-token")).toBeEnabled();
    await userEvent.clear(within(dialog).getByLabelText(/^Uses/)); // no silent default
    expect(within(dialog).getByTestId("create-enrollment-token")).toBeDisabled();
    expect(server.calls("POST /api/v1/enrollment-tokens")).toHaveLength(0);
  });

  it("shows the server's refusal", async () => {
    const server = enrollServer();
    server.set({ "POST /api/v1/enrollment-tokens": () =>
      problem(403, "forbidden", "'op1' lacks the permission 'hosts:enroll' for enrollment_token.create") });
    renderWith(<HostsPage />);
    await userEvent.click(await screen.findByRole("button", { name: "Enroll a host" }));
    const dialog = await screen.findByRole("dialog", { name: "Enroll a host" });
    await userEvent.type(within(dialog).getByRole("textbox", { name: /Host group/ }), "db{Enter}");
    const alert = await within(dialog).findByRole("alert");
    expect(alert).toHaveTextContent("Token not created");
    expect(alert).toHaveTextContent("lacks the permission 'hosts:enroll'");
    expect(alert).toHaveTextContent("Your role does not allow this action");
  });

  it("when the agent port is disabled, says so and how to enable it, and still shows the token", async () => {
    enrollServer({ ...INFO, agent_url: null, install_url: null, install_command: null });
    renderWith(<HostsPage />);
    await userEvent.click(await screen.findByRole("button", { name: "Enroll a host" }));
    const dialog = await screen.findByRole("dialog", { name: "Enroll a host" });
    expect(await within(dialog).findByTestId("agent-port-disabled")).toHaveTextContent("STRONGROOM_AGENT_ENABLED=true");
    await userEvent.type(within(dialog).getByRole("textbox", { name: /Host group/ }), "db{Enter}");
    await within(dialog).findByTestId("enroll-instructions");
    const warning = within(dialog).getByTestId("agent-port-disabled");
    expect(warning).toHaveTextContent("STRONGROOM_AGENT_PORT");
    expect(within(dialog).queryByTestId("install-command")).toBeNull();
    expect(within(dialog).getByTestId("enrollment-secret")).toHaveTextContent(SECRET);
  });

  it("when the one-liner points at this machine's loopback, says so before and with the command", async () => {
    const warning = "https://127.0.0.1:8443 is this machine's loopback address: … Set STRONGROOM_AGENT_HOST=0.0.0.0 "
      + "and STRONGROOM_AGENT_PUBLIC_URL=https://NAME:PORT";
    enrollServer({ ...INFO, agent_url: "https://127.0.0.1:8443", install_url: "https://127.0.0.1:8443/install.sh",
                   install_command: "curl -fsS --cacert ca.pem https://127.0.0.1:8443/install.sh | sh -s -- --token TOKEN",
                   install_command_warning: warning });
    renderWith(<HostsPage />);
    await userEvent.click(await screen.findByRole("button", { name: "Enroll a host" }));
    const dialog = await screen.findByRole("dialog", { name: "Enroll a host" });
    expect(await within(dialog).findByTestId("install-command-warning")).toHaveTextContent("STRONGROOM_AGENT_PUBLIC_URL");
    await userEvent.type(within(dialog).getByRole("textbox", { name: /Host group/ }), "db{Enter}");
    await within(dialog).findByTestId("enroll-instructions");
    expect(within(dialog).getByTestId("install-command-warning")).toHaveTextContent("Other hosts cannot reach this address");
    expect(within(dialog).getByTestId("install-command")).toHaveTextContent(`127.0.0.1:8443/install.sh | sh -s -- --token ${SECRET}`);
  });
});

describe("Host detail", () => {
  const H = HOSTS[1];
  function detailServer() {
    return fakeApi({
      "GET /api/v1/hosts/:id": ({ params }) => HOSTS.find((h) => h.id === params.id)
        ?? problem(404, "host_not_found", `no host ${params.id}`),
      "GET /api/v1/keys": () => page([key("payments-db"), key("ledger", { state: "deactivated" })]),
      "GET /api/v1/audit/events": ({ url }) => ({
        total: 1, total_exact: true, next_before_seq: null,
        items: url.searchParams.get("actor") === `host:${H.hostname}`
          ? [{ seq: 42, time: ago(30), actor: `host:${H.hostname}`, actor_type: "host", action: "key.deliver",
               object_type: "key", object_id: "payments-db-id", outcome: "allowed", source_ip: "10.0.4.22",
               request_id: null, details: { host: H.id, version: 2 }, prev_hash: "00", hash: "11" },
             // An earlier host enrolled under the same name: its records are not this host's.
             { seq: 5, time: ago(90_000), actor: `host:${H.hostname}`, actor_type: "host", action: "agent.access.denied",
               object_type: "file", object_id: "/srv/a/x", outcome: "denied", source_ip: "10.0.4.9",
               request_id: null, details: { host: "00000000-0000-4000-8000-000000000000" }, prev_hash: "00", hash: "33" }]
          : [{ seq: 7, time: ago(86_400), actor: `enrolling:${H.hostname}`, actor_type: "host", action: "host.enroll",
               object_type: "host", object_id: H.id, outcome: "allowed", source_ip: "10.0.4.22", request_id: null,
               details: {}, prev_hash: "00", hash: "22" }],
      }),
      "POST /api/v1/hosts/:id/revoke": () => ({ ...H, state: "revoked", online: false, revoked_at: ago(0) }),
      "GET /api/v1/guard-points": [
        gp({ id: "g1", path: "/srv/wal", key_name: "wal-key", host_group: "db" }),
        gp({ id: "g2", path: "/srv/only-this", key_name: "one-host-key", host_group: null, host_id: H.id }),
        gp({ id: "g3", path: "/srv/web", key_name: "web-key", host_group: "web" }),
      ],
    });
  }

  function gp(over: Record<string, unknown>) {
    return { id: "g", host_group: null, host_id: null, path: "/srv", backing_path: null, key_id: "k", key_name: "k",
             chunk_size: 65536, mode: "enforce", rules: [], default_effect: "deny", revision: 1, rekey_generation: 0,
             unprotect_generation: 0, created_by: "admin1", created_at: ago(60), updated_at: ago(60), ...over };
  }

  it("counts the keys its guard points deliver among the keys it can receive", async () => {
    detailServer();
    renderWith(<HostDetailPage />, { at: `/hosts/${H.id}`, path: "/hosts/:hostId", me: meAs("auditor") });
    const viaGps = await screen.findByTestId("host-gp-keys");
    expect([...viaGps.querySelectorAll("tbody tr td:first-child")].map((td) => td.textContent))
      .toEqual(["wal-key", "one-host-key"]); // its group's and its own, not the web group's
    expect(within(viaGps).getByText("/srv/only-this").closest("tr")).toHaveTextContent("this host");
  });

  it("shows a revoked host's guard points as stopped, with what it last reported", async () => {
    const R = HOSTS[3];
    fakeApi({
      "GET /api/v1/hosts/:id": { ...R, guard_points: [{ path: "/srv/pgdata", key: "payments-db", state: "mounted", detail: "" }] },
      "GET /api/v1/keys": () => page([]),
      "GET /api/v1/audit/events": { total: 0, total_exact: true, next_before_seq: null, items: [] },
      "GET /api/v1/guard-points": [],
    });
    renderWith(<HostDetailPage />, { at: `/hosts/${R.id}`, path: "/hosts/:hostId", me: meAs("auditor") });
    const state = await screen.findByTestId("gp-state-revoked");
    expect(state).toHaveTextContent("stopped");
    expect(state).toHaveTextContent("last reported mounted");
    expect(within(screen.getByTestId("guard-points")).queryByText(/^mounted$/)).toBeNull();
  });

  it("shows identity, guard points, the keys its group receives and its own audit events", async () => {
    const server = detailServer();
    renderWith(<HostDetailPage />, { at: `/hosts/${H.id}`, path: "/hosts/:hostId", me: meAs("auditor") });
    expect(await screen.findByTestId("host-name")).toHaveTextContent(H.hostname);
    const identity = screen.getByTestId("host-identity");
    for (const text of [H.id, "5A1F00C3D2", "Debian 13", "0.4.0", "10.0.4.21"]) expect(identity).toHaveTextContent(text);
    expect(screen.getByTestId("host-offline")).toHaveTextContent("No heartbeat since");
    const gps = screen.getByTestId("guard-points");
    expect(within(gps).getByText("key ledger: forbidden")).toBeInTheDocument();
    expect(within(gps).getByRole("link", { name: "ledger" })).toHaveAttribute("href", "/keys/ledger");
    const keys = await screen.findByTestId("host-keys");
    expect(within(keys).getByRole("link", { name: "payments-db" })).toHaveAttribute("href", "/keys/payments-db");
    expect(server.calls("GET /api/v1/keys")[0].url.searchParams.get("tag")).toBe("host-group=db");
    const events = await screen.findByTestId("host-events");
    expect([...events.querySelectorAll("tbody tr td:nth-child(4)")].map((td) => td.textContent))
      .toEqual(["key.deliver", "host.enroll"]);
    // Its guard points' timeline (the agent's records), its recent records, what was done to it.
    expect(server.calls("GET /api/v1/audit/events").map((c) => [c.url.searchParams.get("actor") ?? c.url.searchParams.get("object_id"),
                                                               c.url.searchParams.get("action")]))
      .toEqual([[`host:${H.hostname}`, "agent.guardpoint."], [`host:${H.hostname}`, null], [H.id, null]]);
    // Read-only for an auditor.
    expect(screen.queryByTestId("revoke-host")).toBeNull();
  });

  it("revokes only after the hostname is typed, explaining the consequence", async () => {
    const server = detailServer();
    renderWith(<HostDetailPage />, { at: `/hosts/${H.id}`, path: "/hosts/:hostId", me: meAs("operator") });
    await userEvent.click(await screen.findByTestId("revoke-host"));
    const dialog = await screen.findByRole("dialog", { name: `Revoke ${H.hostname}` });
    expect(dialog).toHaveTextContent("refuses this host's certificate from its next call on");
    expect(dialog).toHaveTextContent("drops every key it has cached");
    expect(dialog).toHaveTextContent("enroll it again with a new enrollment token");
    const submit = within(dialog).getByRole("button", { name: "Revoke host" });
    await userEvent.type(within(dialog).getByTestId("typed-confirm-input"), "db-02");
    expect(submit).toBeDisabled();
    await userEvent.type(within(dialog).getByTestId("typed-confirm-input"), ".prod.example.com");
    await userEvent.click(submit);
    expect(await screen.findByTestId("host-revoked")).toHaveTextContent("enroll it again with a new enrollment token");
    expect(server.calls("POST /api/v1/hosts/:id/revoke").map((c) => c.params.id)).toEqual([H.id]);
    expect(screen.queryByTestId("revoke-host")).toBeNull();
    // An operator lacks audit:read: no activity section, and no request for it.
    expect(screen.queryByText("Recent activity")).toBeNull();
    expect(server.calls("GET /api/v1/audit/events")).toHaveLength(0);
  });

  it("a second revocation's conflict is shown in the dialog", async () => {
    const server = detailServer();
    server.set({ "POST /api/v1/hosts/:id/revoke": () => problem(409, "host_revoked", `host ${H.hostname} is already revoked`) });
    renderWith(<HostDetailPage />, { at: `/hosts/${H.id}`, path: "/hosts/:hostId" });
    await userEvent.click(await screen.findByTestId("revoke-host"));
    await userEvent.type(await screen.findByTestId("typed-confirm-input"), `${H.hostname}{Enter}`);
    const alert = await within(screen.getByRole("dialog")).findByRole("alert");
    expect(alert).toHaveTextContent("Conflict");
    expect(alert).toHaveTextContent("is already revoked");
  });

  it("an unknown host is a clear not-found", async () => {
    detailServer();
    renderWith(<HostDetailPage />, { at: "/hosts/99999999-9999-4999-8999-999999999999", path: "/hosts/:hostId" });
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("This host could not be loaded");
    expect(alert).toHaveTextContent("host_not_found");
    expect(screen.getByRole("link", { name: "Hosts" })).toHaveAttribute("href", "/hosts");
  });
});

describe("Dashboard hosts panel", () => {
  it("counts hosts online, offline and revoked, and lists what needs attention", async () => {
    fakeApi({ "GET /api/v1/hosts": ({ url }) => hostPage(HOSTS, url) });
    renderWith(<HostsSummary />);
    await screen.findByTestId("hosts-online");
    expect(["online", "offline", "revoked"].map((s) => screen.getByTestId(`hosts-${s}`).getAttribute("data-count")))
      .toEqual(["1", "2", "1"]);
    expect(screen.getByRole("link", { name: /^2\s*Offline$/ })).toHaveAttribute("href", "/hosts?status=offline");
    const attention = screen.getByTestId("hosts-attention");
    expect(attention).toHaveTextContent("db-02.prod.example.comno heartbeat for 2 hours; 1 guard point in error");
    expect(within(attention).getByRole("link", { name: "web-01.example.com" })).toHaveAttribute("href", `/hosts/${HOSTS[2].id}`);
    expect(attention).toHaveTextContent("web-01.example.comnever sent a heartbeat");
    expect(attention).not.toHaveTextContent("old-db");
  });

  it("a revoked host needs no attention; an online one only for guard-point errors", () => {
    expect(hostAttention(HOSTS[3])).toBeNull();
    expect(hostAttention(HOSTS[0])).toBeNull();
    expect(hostAttention({ ...HOSTS[0], guard_points: HOSTS[1].guard_points })).toBe("1 guard point in error");
  });
});

describe("Key detail", () => {
  it("a key tagged for a host group links to that group's hosts", async () => {
    fakeApi({
      "GET /api/v1/keys/:ref": () => key("payments-db"),
      "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null },
    });
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("auditor") });
    expect(await screen.findByTestId("key-hosts")).toHaveAttribute("href", "/hosts?group=db");
    expect(screen.getByTestId("key-hosts")).toHaveTextContent("hosts of group db");
  });
});
