import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import type { KmipGrant, KmipGroup } from "../kmip";
import { KmipClientsPage, clientStatus, opensslFingerprint } from "./Kmip";

/** Replace a field's text as a paste does: what is tested is the value, and typing it key by
 *  key (a render per key) took seconds per field on a loaded machine. */
async function fill(field: HTMLElement, text: string) {
  await userEvent.clear(field);
  await userEvent.paste(text);
}

type Client = Schemas["KmipClientPublic"];
const inDays = (d: number) => new Date(Date.now() + d * 86_400_000).toISOString();
const client = (over: Partial<Client>): Client => ({
  id: "11111111-1111-4111-8111-111111111111", name: "backup-01.example.com", role: "kmip-client", serial: "5A1F",
  fingerprint_sha256: "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789",
  not_after: inDays(365), created_at: inDays(-2), created_by: "admin", revoked_at: null, key_export: "plaintext",
  group: "backups", ...over,
});
const CLIENTS = [client({}), client({ id: "2", name: "tde.db.example.com", not_after: inDays(10), key_export: "wrapped", group: "vsphere" }),
                 client({ id: "3", name: "old.example.com", revoked_at: inDays(-1) })];
const PEM = { certificate_pem: "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
              ca_certificate_pem: "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n" };

describe("KMIP clients page", () => {
  it("lists each client's status, role, export setting and expiry, warning before it expires", async () => {
    fakeApi({ "GET /api/v1/kmip/clients": CLIENTS });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    const table = await screen.findByTestId("kmip-clients-table");
    const soon = within(table).getByText("tde.db.example.com").closest("tr")!;
    expect(within(soon).getByText("wrapped only")).toBeInTheDocument();
    expect(within(soon).getByText(/in 10 days|in 9 days/)).toHaveStyle({ color: "var(--sr-text-warning)" });
    const old = within(table).getByText("old.example.com").closest("tr")!;
    expect(within(old).getByText("revoked")).toBeInTheDocument();
    expect(within(old).queryByRole("button", { name: /Revoke/ })).toBeNull();
  });

  it("lets a long name and group wrap after each dot, and shows role and key export together", async () => {
    fakeApi({ "GET /api/v1/kmip/clients": [client({ name: "vcenter01.datacenter.corp.example.net", group: "vcenter01.datacenter" })] });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    const table = await screen.findByTestId("kmip-clients-table");
    const name = within(table).getByText("vcenter01.datacenter.corp.example.net");
    expect(name.querySelectorAll("wbr")).toHaveLength(4);
    expect(within(table).getByTestId("kmip-client-group").querySelectorAll("wbr")).toHaveLength(1);
    expect(within(table).getByRole("columnheader", { name: "Role and key export" })).toBeInTheDocument();
    expect(name.closest("tr")).toHaveTextContent("kmip-clientkey export plaintext");
  });

  it("creates a client with a server-made key, then offers the three files once", async () => {
    const api = fakeApi({
      "GET /api/v1/kmip/clients": [],
      "POST /api/v1/kmip/clients": ({ body }) => json(201, { client: client({ name: (body as { name: string }).name }), ...PEM,
                                                          private_key_pem: "-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----\n" }),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-kmip-client"));
    const form = await screen.findByRole("form", { name: "Create KMIP client" });
    await fill(within(form).getByRole("textbox", { name: /Name/ }), "not a dns name!");
    expect(within(form).getByText(/A DNS name in lower case/)).toBeInTheDocument();
    expect(within(form).getByTestId("create-kmip-client-submit")).toBeDisabled();
    // The server takes lower case only: refused here, before a request that would fail.
    await fill(within(form).getByRole("textbox", { name: /Name/ }), "Backup-02.example.com");
    expect(within(form).getByTestId("create-kmip-client-submit")).toBeDisabled();
    await fill(within(form).getByRole("textbox", { name: /Name/ }), "backup-02.example.com");
    await userEvent.click(within(form).getByTestId("create-kmip-client-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/kmip/clients")).toHaveLength(1));
    expect(api.calls("POST /api/v1/kmip/clients")[0].body).toEqual(
      { name: "backup-02.example.com", role: "kmip-client", key_export: "plaintext", csr: null });
    const issued = await screen.findByTestId("kmip-issued");
    expect(within(issued).getByText("The private key is shown this once")).toBeInTheDocument();
    expect(within(issued).getByTestId("download-key")).toHaveTextContent("backup-02.example.com-key.pem");
    expect(within(issued).getByText(/certfile=\/etc\/pykmip\/backup-02.example.com-cert.pem/)).toBeInTheDocument();
  });

  it("from a CSR there is no key to download", async () => {
    fakeApi({
      "GET /api/v1/kmip/clients": [],
      "POST /api/v1/kmip/clients": () => json(201, { client: client({}), ...PEM, private_key_pem: null }),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-kmip-client"));
    const form = await screen.findByRole("form", { name: "Create KMIP client" });
    await fill(within(form).getByRole("textbox", { name: /Name/ }), "backup-01.example.com");
    await fill(within(form).getByRole("textbox", { name: /Certificate request/ }),
                         "-----BEGIN CERTIFICATE REQUEST-----\nMIIC\n-----END CERTIFICATE REQUEST-----");
    await userEvent.click(within(form).getByTestId("create-kmip-client-submit"));
    const issued = await screen.findByTestId("kmip-issued");
    expect(within(issued).queryByTestId("download-key")).toBeNull();
    expect(within(issued).getByText(/the private key never left the client's host/)).toBeInTheDocument();
  });

  it("revokes only after the name is typed, and shows a refusal with its detail", async () => {
    const api = fakeApi({
      "GET /api/v1/kmip/clients": CLIENTS,
      "DELETE /api/v1/kmip/clients/:id": () => problem(409, "kmip_client_revoked", "backup-01.example.com was revoked already"),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByRole("button", { name: "Revoke KMIP client backup-01.example.com" }));
    const submit = await screen.findByTestId("typed-confirm-submit");
    expect(submit).toBeDisabled();
    await fill(screen.getByTestId("typed-confirm-input"), "backup-01.example.com");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("DELETE /api/v1/kmip/clients/:id")).toHaveLength(1));
    expect(api.calls("DELETE /api/v1/kmip/clients/:id")[0].params.id).toBe(CLIENTS[0].id);
    expect(await screen.findByText("backup-01.example.com was revoked already")).toBeInTheDocument();
  });

  it("changes what key material may leave, saying what changes", async () => {
    const api = fakeApi({
      "GET /api/v1/kmip/clients": CLIENTS,
      "PATCH /api/v1/kmip/clients/:id": ({ body }) => client({ ...(body as object) }),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByRole("button", { name: "Change key export of backup-01.example.com" }));
    expect(await screen.findByRole("radio", { name: /plaintext/ })).toBeChecked();
    await userEvent.click(screen.getByRole("radio", { name: /^none/ }));
    expect(await screen.findByTestId("key-export-change")).toHaveTextContent("no key material leaves");
    await userEvent.click(screen.getByTestId("key-export-save"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/kmip/clients/:id")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/kmip/clients/:id")[0].body).toEqual({ key_export: "none" });
  });

  it("fingerprints read as openssl prints them", () => {
    expect(opensslFingerprint("abcdef0123")).toBe("AB:CD:EF:01:23");
  });

  it("statuses: revoked, expired, active", () => {
    expect(clientStatus(client({ revoked_at: inDays(-1) })).label).toBe("revoked");
    expect(clientStatus(client({ not_after: inDays(-1) })).label).toBe("expired");
    expect(clientStatus(client({})).label).toBe("active");
  });
});

const KEY_ID = "6603c18c-39c3-4619-bb48-e05423636617";
const GROUPS: KmipGroup[] = [
  { name: "backups", clients: ["backup-01.example.com", "old.example.com"], objects: 12 },
  { name: "vsphere", clients: ["tde.db.example.com"], objects: 3 },
  { name: "shared", clients: [], objects: 40 },
];
const grantOf = (over: Partial<KmipGrant> = {}): KmipGrant => ({
  id: "0b9f2c1e-0000-4000-8000-000000000001", grantee: "client:backup-01.example.com", target_kind: "key", target: KEY_ID,
  target_name: "payments-db", rights: ["use", "read"], created_by: "admin1", created_at: inDays(-1), ...over,
});
const GRANTS = [grantOf(), grantOf({ id: "0b9f2c1e-0000-4000-8000-000000000002", grantee: "group:vsphere", target_kind: "group",
                                     target: "shared", target_name: "shared", rights: ["destroy", "export", "read", "use"] })];
const KEYS = { items: [{ id: KEY_ID, name: "payments-db" }, { id: "7703c18c-39c3-4619-bb48-e05423636617", name: "reports-db" }],
               total: 2, limit: 50, offset: 0 };

/** The KMIP page's server: clients, groups, grants and a key search. */
function tenancy(more: Parameters<typeof fakeApi>[0] = {}) {
  return fakeApi({
    "GET /api/v1/kmip/clients": CLIENTS, "GET /api/v1/kmip/groups": GROUPS, "GET /api/v1/kmip/grants": GRANTS,
    "GET /api/v1/keys": KEYS, ...more,
  });
}

async function pick(form: HTMLElement, field: RegExp, option: string) {
  await userEvent.click(within(form).getByRole("textbox", { name: field }));
  await userEvent.click(await screen.findByRole("option", { name: option }));
}

describe("KMIP tenancy: groups", () => {
  it("shows each client's group and moves one, checking the server's rule while typing", async () => {
    const api = tenancy({ "PATCH /api/v1/kmip/clients/:id": ({ body }) => client({ ...(body as object) }) });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    const table = await screen.findByTestId("kmip-clients-table");
    const row = within(table).getByText("tde.db.example.com").closest("tr")!;
    expect(within(row).getByTestId("kmip-client-group")).toHaveTextContent("vsphere");
    await userEvent.click(within(within(table).getByText("backup-01.example.com").closest("tr")!)
      .getByRole("button", { name: "Change group of backup-01.example.com" }));
    const form = await screen.findByRole("form", { name: "Group of backup-01.example.com" });
    const input = within(form).getByTestId("kmip-group-input");
    const save = within(form).getByTestId("kmip-group-save");
    expect(input).toHaveValue("backups");
    expect(save).toBeDisabled(); // unchanged
    for (const [typed, said] of [
      ["VSphere", "Lower case only: vsphere"], ["-vsphere", "Starts with a lower-case letter or digit"],
      ["v sphere/prod", 'Lower-case letters, digits, dots, hyphens and underscores only (not a space, "/")'],
      ["a".repeat(65), "At most 64 characters; this one has 65"], ["", "Required: the group whose objects it sees"],
    ] as const) {
      await fill(input, typed);
      expect(within(form).getByText(said)).toBeInTheDocument();
      expect(save).toBeDisabled();
    }
    await fill(input, "vsphere");
    // The groups' members arrive with their own request: wait for them, whatever the machine's load.
    await waitFor(() => expect(within(form).getByTestId("kmip-group-change")).toHaveTextContent(
      /sees the objects of group vsphere \(with tde.db.example.com\) and no longer those of backups.*objects it created stay in backups/));
    await userEvent.click(save);
    await waitFor(() => expect(api.calls("PATCH /api/v1/kmip/clients/:id")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/kmip/clients/:id")[0]).toMatchObject({ params: { id: CLIENTS[0].id }, body: { group: "vsphere" } });
    await waitFor(() => expect(screen.queryByRole("form", { name: "Group of backup-01.example.com" })).toBeNull());
  });

  it("shows the server's words under the group when it refuses one", async () => {
    tenancy({ "PATCH /api/v1/kmip/clients/:id": () => json(422, {
      type: "about:blank", title: "invalid_input", status: 422, code: "invalid_input", detail: "invalid request",
      errors: [{ loc: ["body", "group"], msg: "Value error, the group name _x is reserved", type: "value_error" }] }) });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByRole("button", { name: "Change group of backup-01.example.com" }));
    const form = await screen.findByRole("form", { name: "Group of backup-01.example.com" });
    await fill(within(form).getByTestId("kmip-group-input"), "x");
    await userEvent.click(within(form).getByTestId("kmip-group-save"));
    expect(await within(form).findAllByText("the group name _x is reserved")).not.toHaveLength(0);
    expect(within(form).getByText("Group not changed")).toBeInTheDocument();
  });

  it("issues a client into a group, naming the clients it shares objects with", async () => {
    const api = tenancy({
      "GET /api/v1/kmip/clients": [],
      "POST /api/v1/kmip/clients": ({ body }) => json(201, { client: client(body as Partial<Client>), ...PEM, private_key_pem: null }),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-kmip-client"));
    const form = await screen.findByRole("form", { name: "Create KMIP client" });
    await fill(within(form).getByRole("textbox", { name: /Name/ }), "backup-02.example.com");
    const group = within(form).getByTestId("create-kmip-client-group");
    expect(group).toHaveAttribute("placeholder", "backup-02.example.com"); // the default: a group of its own
    await fill(group, "Backups");
    expect(within(form).getByText("Lower case only: backups")).toBeInTheDocument();
    expect(within(form).getByTestId("create-kmip-client-submit")).toBeDisabled();
    await fill(group, "backups");
    expect(await within(form).findByText("Shares the objects of this group with backup-01.example.com, old.example.com")).toBeInTheDocument();
    await userEvent.click(within(form).getByTestId("create-kmip-client-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/kmip/clients")).toHaveLength(1));
    expect(api.calls("POST /api/v1/kmip/clients")[0].body).toEqual(
      { name: "backup-02.example.com", role: "kmip-client", key_export: "plaintext", csr: null, group: "backups" });
  });

  it("lists the groups with their clients and object counts", async () => {
    tenancy();
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=groups" });
    const table = await screen.findByTestId("kmip-groups-table");
    const backups = within(table).getByText("backups").closest("tr")!;
    expect(backups).toHaveTextContent("backup-01.example.com, old.example.com");
    expect(backups).toHaveTextContent("12");
    expect(within(table).getByText("shared").closest("tr")).toHaveTextContent("none: only grants reach its objects");
    // Granting on a group starts from that group.
    await userEvent.click(within(table).getByRole("button", { name: "Grant access to group shared" }));
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    await waitFor(() => expect(within(form).getByTestId("grant-group")).toHaveValue("shared"));
  });
});

describe("KMIP tenancy: grants", () => {
  it("lists grantee, target by name, rights as badges and who granted it", async () => {
    tenancy();
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants" });
    const table = await screen.findByTestId("kmip-grants-table");
    const onKey = table.querySelector(`tr[data-grant="${GRANTS[0].id}"]`) as HTMLElement;
    expect(onKey).toHaveTextContent("clientbackup-01.example.com");
    expect(within(onKey).getByRole("link", { name: "payments-db" })).toHaveAttribute("href", `/keys/${KEY_ID}`);
    expect(within(onKey).getByTestId("grant-rights")).toHaveTextContent("readuse"); // in the order of the rights
    expect(onKey).toHaveTextContent("1 day ago");
    expect(onKey).toHaveTextContent("by admin1");
    const onGroup = table.querySelector(`tr[data-grant="${GRANTS[1].id}"]`) as HTMLElement;
    expect(onGroup).toHaveTextContent("groupvsphere");
    expect(onGroup).toHaveTextContent("every object of group");
    expect(within(onGroup).getByTestId("grant-rights")).toHaveTextContent("readuseexportdestroy");
  });

  it("shows one grantee's grants, asked of the server, from a link or the filter", async () => {
    const api = tenancy({ "GET /api/v1/kmip/grants": ({ url }) => {
      const who = url.searchParams.get("grantee");
      return who ? GRANTS.filter((g) => g.grantee === who) : GRANTS;
    } });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants&grantee=group:vsphere" });
    const table = await screen.findByTestId("kmip-grants-table");
    expect(api.calls("GET /api/v1/kmip/grants")[0].url.searchParams.get("grantee")).toBe("group:vsphere");
    expect(table.querySelectorAll("tr[data-grant]")).toHaveLength(1);
    expect(screen.getByTestId("grants-filter")).toHaveValue("vsphere");
    await userEvent.click(screen.getByTestId("grants-filter"));
    await userEvent.click(await screen.findByRole("option", { name: "backup-01.example.com" }));
    await waitFor(() => expect(api.calls("GET /api/v1/kmip/grants").map((c) => c.url.searchParams.get("grantee")))
      .toContain("client:backup-01.example.com"));
    await waitFor(() => expect(screen.getByTestId("kmip-grants-table").querySelector(`tr[data-grant="${GRANTS[0].id}"]`)).not.toBeNull());
    expect(screen.getByTestId("kmip-grants-table").querySelectorAll("tr[data-grant]")).toHaveLength(1);
    api.set({ "GET /api/v1/kmip/grants": [] });
    await userEvent.click(screen.getByTestId("grants-filter"));
    await userEvent.click(await screen.findByRole("option", { name: "old.example.com" }));
    expect(await screen.findByText("No grant to old.example.com")).toBeInTheDocument();
  });

  it("revokes a grant after confirmation, showing the server's refusal as words", async () => {
    const api = tenancy({ "DELETE /api/v1/kmip/grants/:id": () => problem(404, "kmip_grant_not_found",
      "no grant 0b9f2c1e-0000-4000-8000-000000000001: it was revoked already") });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants" });
    await userEvent.click(await screen.findByRole("button", { name: "Revoke the grant of payments-db to backup-01.example.com" }));
    const dialog = await screen.findByRole("dialog", { name: "Revoke the grant of payments-db to backup-01.example.com" });
    expect(dialog).toHaveTextContent("From its next request, backup-01.example.com can use these rights on payments-db");
    await userEvent.click(within(dialog).getByTestId("revoke-grant-confirm"));
    expect(await within(dialog).findByText("no grant 0b9f2c1e-0000-4000-8000-000000000001: it was revoked already")).toBeInTheDocument();
    expect(within(dialog).getByText(/go back to the list and open it again/)).toBeInTheDocument();
    api.set({ "DELETE /api/v1/kmip/grants/:id": () => new Response(null, { status: 204 }) });
    await userEvent.click(within(dialog).getByTestId("revoke-grant-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/kmip/grants/:id")).toHaveLength(2));
    expect(api.calls("DELETE /api/v1/kmip/grants/:id")[1].params.id).toBe(GRANTS[0].id);
    await waitFor(() => expect(screen.queryByRole("dialog", { name: /^Revoke the grant/ })).toBeNull());
  });

  it("grants a client rights on a key: each right explained, one at least, a duplicate refused before sending", async () => {
    const api = tenancy({ "POST /api/v1/kmip/grants": () => problem(409, "kmip_grant_exists",
      "client:tde.db.example.com has grant 0b9f… on payments-db already: revoke it first") });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants" });
    await userEvent.click(await screen.findByTestId("grant-kmip-access"));
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    const submit = within(form).getByTestId("grant-kmip-submit");
    expect(within(form).getByRole("checkbox", { name: /^read/ })).toBeChecked();
    expect(form).toHaveTextContent("Locate it and read its attributes");
    expect(form).toHaveTextContent("Encrypt, decrypt, sign, verify and MAC with it");
    expect(form).toHaveTextContent("Get the key material, still limited by the client's key export setting");
    expect(form).toHaveTextContent("Revoke and destroy it");
    expect(submit).toBeDisabled();
    // A revoked client is not offered.
    await userEvent.click(within(form).getByRole("textbox", { name: /^Grantee/ }));
    expect(await screen.findByRole("option", { name: "tde.db.example.com" })).toBeInTheDocument();
    expect(screen.queryByRole("option", { name: "old.example.com" })).toBeNull();
    await userEvent.click(screen.getByRole("option", { name: "backup-01.example.com" }));
    await pick(form, /^Key/, "payments-db");
    expect(await within(form).findByTestId("grant-duplicate")).toHaveTextContent(
      "backup-01.example.com has a grant on payments-db already (read, use): revoke it first");
    expect(submit).toBeDisabled();
    await pick(form, /^Grantee/, "tde.db.example.com");
    expect(within(form).queryByTestId("grant-duplicate")).toBeNull();
    await userEvent.click(within(form).getByRole("checkbox", { name: /^read/ }));
    expect(within(form).getByText("Choose at least one right")).toBeInTheDocument();
    expect(submit).toBeDisabled();
    await userEvent.click(within(form).getByRole("checkbox", { name: /^export/ }));
    await userEvent.click(within(form).getByRole("checkbox", { name: /^use/ }));
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/kmip/grants")).toHaveLength(1));
    expect(api.calls("POST /api/v1/kmip/grants")[0].body).toEqual(
      { grantee: "client:tde.db.example.com", key: KEY_ID, rights: ["use", "export"] });
    const alert = await within(form).findByRole("alert");
    expect(alert).toHaveTextContent("Access not granted");
    expect(alert).toHaveTextContent("has grant 0b9f… on payments-db already: revoke it first");
    // Accepted the second time: the dialog closes.
    api.set({ "POST /api/v1/kmip/grants": ({ body }) => json(201, grantOf({ id: "new", ...(body as object), grantee: "client:tde.db.example.com" })) });
    await userEvent.click(submit);
    await waitFor(() => expect(screen.queryByRole("form", { name: "Grant KMIP access" })).toBeNull());
  });

  it("grants a group a group's objects, and says when the grantee has them already", async () => {
    const api = tenancy({ "POST /api/v1/kmip/grants": ({ body }) => json(201, grantOf({ id: "new", ...(body as object) })) });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants" });
    await userEvent.click(await screen.findByTestId("grant-kmip-access"));
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    await pick(form, /^Grantee/, "backups");
    await userEvent.click(within(form).getByRole("radio", { name: "A group's objects" }));
    await pick(form, /^Group/, "backups");
    expect(await within(form).findByTestId("grant-own-group")).toHaveTextContent("its clients see that group's objects without a grant");
    expect(within(form).getByTestId("grant-kmip-submit")).toBeDisabled();
    await pick(form, /^Group/, "shared");
    expect(within(form).queryByTestId("grant-own-group")).toBeNull();
    await userEvent.click(within(form).getByTestId("grant-kmip-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/kmip/grants")).toHaveLength(1));
    expect(api.calls("POST /api/v1/kmip/grants")[0].body).toEqual({ grantee: "group:backups", group: "shared", rights: ["read"] });
  });

  it("opens on a key when a key's page links here", async () => {
    tenancy();
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants&grant_key=payments-db" });
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    expect(within(form).getByTestId("grant-key")).toHaveValue("payments-db");
  });

  it("does not offer export to a role that may not export keys (the server refuses it too)", async () => {
    tenancy();
    const me = meAs("admin");
    renderWith(<KmipClientsPage />, { me: { ...me, permissions: me.permissions.filter((p) => p !== "keys:export") }, at: "/?view=grants" });
    await userEvent.click(await screen.findByTestId("grant-kmip-access"));
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    expect(within(form).getByRole("checkbox", { name: /^export/ })).toBeDisabled();
    expect(form).toHaveTextContent("Granting it needs keys:export, which your role lacks");
  });
});
