import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { keyIdError, nextKeyId, type Database, type Grant } from "../databases";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { DatabaseDetailPage } from "./DatabaseDetail";
import { DatabasesPage, caFileOf } from "./Databases";

/** Replace a field's text as a paste does (a render per key is slow on a loaded machine). */
async function fill(field: HTMLElement, text: string) {
  await userEvent.clear(field);
  if (text) await userEvent.paste(text);
}

const ago = (minutes: number) => new Date(Date.now() - minutes * 60_000).toISOString();
const KEY_UUID = "6603c18c-39c3-4619-bb48-e05423636617";
const grant = (over: Partial<Grant> = {}): Grant => ({
  key_id: 1, key_name: "payments-tde", key_uuid: KEY_UUID, granted_at: ago(120), granted_by: "admin1",
  last_read_at: ago(5), last_read_version: 3, ...over,
});
const db = (over: Partial<Database> = {}): Database => ({
  id: "11111111-1111-4111-8111-111111111111", name: "payments-db-01", description: "Card vault, eu-west",
  kind: "mariadb", created_at: ago(300), created_by: "admin1", last_seen_at: ago(5), revoked_at: null,
  grants: [grant()], ...over,
});
const page = (items: Database[]) => ({ items, total: items.length, limit: items.length, offset: 0 });
const CONFIG = "[mariadb]\nplugin-load-add = hashicorp_key_management\nhashicorp-key-management-token = srdb_abc_SECRET\n"
  + "hashicorp-key-management-vault-ca = /etc/mysql/strongroom-ca.pem\n";
const issued = (d: Database) => ({ database: d, token: "srdb_abc_SECRET", vault_url: "https://kms.example.net:8800/v1/strongroom",
                                   config: CONFIG });
const key = (over: Partial<Key>): Key => ({
  id: KEY_UUID, name: "payments-tde", description: "", owner: "dba", tags: {}, algorithm: "AES", length_bits: 256,
  state: "active", current_version: 3, created_at: ago(900), updated_at: ago(60), rotation_period_days: 90,
  next_rotation_at: null, exportable: true, kmip_group: null, versions: [], ...over,
});
const KEYS = [key({}), key({ id: "7703c18c-39c3-4619-bb48-e05423636617", name: "reports-tde", current_version: 1 }),
              key({ id: "8803c18c-39c3-4619-bb48-e05423636617", name: "signing-rsa", algorithm: "RSA", length_bits: 3072 }),
              key({ id: "9903c18c-39c3-4619-bb48-e05423636617", name: "locked-aes", exportable: false })];

describe("Databases page", () => {
  it("lists each database's state, keys granted and last read; a database without grants is flagged", async () => {
    fakeApi({ "GET /api/v1/databases": page([db(), db({ id: "2", name: "reports-db", grants: [], last_seen_at: null }),
                                                db({ id: "3", name: "old-db", revoked_at: ago(60) })]) });
    renderWith(<DatabasesPage />, { me: meAs("auditor") });
    const table = await screen.findByTestId("databases-table");
    const pay = within(table).getByText("payments-db-01").closest("tr")!;
    expect(within(pay).getByText("active")).toBeInTheDocument();
    expect(within(pay).getByTestId("grants-count")).toHaveTextContent("1");
    expect(within(pay).getByText("5 minutes ago")).toBeInTheDocument();
    expect(within(pay).getByRole("link", { name: "payments-db-01" })).toHaveAttribute("href", "/databases/payments-db-01");
    const reports = within(table).getByText("reports-db").closest("tr")!;
    expect(within(reports).getByTestId("grants-count")).toHaveTextContent("none: it can read no key");
    expect(within(reports).getByText("never")).toBeInTheDocument();
    expect(within(within(table).getByText("old-db").closest("tr")!).getByText("revoked")).toBeInTheDocument();
    // An auditor reads; connecting is not offered.
    expect(screen.queryByTestId("connect-database")).toBeNull();
    expect(screen.getByTestId("databases-total")).toHaveTextContent("3 databases");
  });

  it("explains how to start when there is none", async () => {
    fakeApi({ "GET /api/v1/databases": page([]) });
    renderWith(<DatabasesPage />, { me: meAs("key-officer") });
    expect(await screen.findByText("No database connected yet")).toBeInTheDocument();
    expect(screen.getByTestId("no-databases")).toHaveTextContent("grant it a key as MariaDB's key id 1");
    expect(screen.getByRole("button", { name: "Connect the first database" })).toBeInTheDocument();
  });

  it("connects a database and shows its token once, with the Vault URL, the my.cnf snippet and what to do next", async () => {
    const api = fakeApi({
      "GET /api/v1/databases": page([]),
      "POST /api/v1/databases": ({ body }) => json(201, issued(db({ ...(body as object), grants: [] }))),
    });
    renderWith(<DatabasesPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("connect-database"));
    const form = await screen.findByRole("form", { name: "Connect a database" });
    const name = within(form).getByRole("textbox", { name: /Name/ });
    await fill(name, "Payments DB");
    expect(within(form).getByText(/Lower-case letters, digits, dots, hyphens and underscores/)).toBeInTheDocument();
    expect(within(form).getByTestId("connect-database-submit")).toBeDisabled();
    await fill(name, "payments-db-01");
    await fill(within(form).getByRole("textbox", { name: /Description/ }), "Card vault, eu-west");
    await userEvent.click(within(form).getByTestId("connect-database-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/databases")).toHaveLength(1));
    expect(api.calls("POST /api/v1/databases")[0].body).toEqual({ name: "payments-db-01", description: "Card vault, eu-west" });
    const shown = await screen.findByRole("dialog", { name: "payments-db-01 connected" });
    expect(within(shown).getByText("The token is shown this once")).toBeInTheDocument();
    expect(within(shown).getByTestId("database-token-value")).toHaveTextContent("srdb_abc_SECRET");
    expect(within(shown).getByRole("button", { name: "Copy the token" })).toBeInTheDocument();
    expect(within(shown).getByTestId("database-vault-url")).toHaveTextContent("https://kms.example.net:8800/v1/strongroom");
    expect(within(shown).getByTestId("database-config")).toHaveTextContent("plugin-load-add = hashicorp_key_management");
    expect(within(shown).getByText("mariadb-plugin-hashicorp-key-management", { exact: false })).toBeInTheDocument();
    expect(within(shown).getByText(/Grant the database a key as key id 1/)).toBeInTheDocument();
    expect(within(shown).getByText("/etc/mysql/strongroom-ca.pem", { selector: "li code" })).toBeInTheDocument();
    expect(within(shown).getByText("systemctl restart mariadb")).toBeInTheDocument();
    // Dismissed by its own button only; once closed the token is gone from the page.
    expect(within(shown).queryByRole("button", { name: "Close dialog" })).toBeNull();
    await userEvent.click(within(shown).getByTestId("database-token-done"));
    await waitFor(() => expect(screen.queryByText("srdb_abc_SECRET")).toBeNull());
  });

  it("refuses a name that is too long while typing, and shows the server's refusal with what to do", async () => {
    const api = fakeApi({
      "GET /api/v1/databases": page([]),
      "POST /api/v1/databases": () => problem(409, "database_exists",
                                              "a database identity named 'payments-db-01' exists (revoked ones keep their name)"),
    });
    renderWith(<DatabasesPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("connect-database"));
    const form = await screen.findByRole("form", { name: "Connect a database" });
    const name = within(form).getByRole("textbox", { name: /Name/ });
    await fill(name, "a".repeat(70));
    expect(within(form).getByText("At most 64 characters; this one has 70")).toBeInTheDocument();
    expect(name).toHaveValue("a".repeat(70)); // nothing cut
    await fill(name, "payments-db-01");
    await userEvent.click(within(form).getByTestId("connect-database-submit"));
    const alert = await within(form).findByRole("alert");
    expect(alert).toHaveTextContent("Database not connected");
    expect(alert).toHaveTextContent("exists (revoked ones keep their name)");
    expect(alert).toHaveTextContent("Choose another name: names are unique, and a revoked database keeps its name.");
    expect(api.calls("POST /api/v1/databases")).toHaveLength(1);
  });

  it("says what went wrong when the list cannot be loaded", async () => {
    fakeApi({ "GET /api/v1/databases": () => problem(503, "database_unavailable", "the store is not reachable") });
    renderWith(<DatabasesPage />, { me: meAs("admin") });
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("Databases could not be loaded");
    expect(alert).toHaveTextContent("retry shortly or check /readyz");
  });
});

function detail(d: Database, more: Parameters<typeof fakeApi>[0] = {}) {
  return fakeApi({
    "GET /api/v1/databases/:name": d,
    "GET /api/v1/keys": ({ url }) => {
      const q = url.searchParams.get("q") ?? "";
      const items = KEYS.filter((k) => k.name.includes(q));
      return { items, total: items.length, limit: 50, offset: 0 };
    },
    ...more,
  });
}
const openDetail = (role: "admin" | "auditor" = "admin") =>
  renderWith(<DatabaseDetailPage />, { at: "/databases/payments-db-01", path: "/databases/:name", me: meAs(role) });

async function openGrant() {
  await userEvent.click(await screen.findByTestId("grant-key"));
  return screen.findByRole("form", { name: "Grant a key to payments-db-01" });
}

async function pickKey(form: HTMLElement, name: string) {
  await userEvent.click(within(form).getByRole("textbox", { name: /^Key/ }));
  await userEvent.click(await screen.findByRole("option", { name }));
}

describe("A database's page", () => {
  it("shows its grants: key id, the key (linked), last read and the version read", async () => {
    detail(db({ grants: [grant({ key_id: 7, key_name: "reports-tde", last_read_at: null, last_read_version: null }), grant()] }));
    openDetail("auditor");
    const table = await screen.findByTestId("grants-table");
    const rows = within(table).getAllByRole("row").slice(1);
    expect(rows[0]).toHaveTextContent("1MariaDB's default");
    expect(within(rows[0]).getByRole("link", { name: "payments-tde" })).toHaveAttribute("href", `/keys/${KEY_UUID}`);
    expect(rows[0]).toHaveTextContent("v3");
    expect(rows[1]).toHaveTextContent("never");
    // Read-only for an auditor.
    expect(screen.queryByTestId("grant-key")).toBeNull();
    expect(within(table).queryByRole("button", { name: /Remove/ })).toBeNull();
  });

  it("grants a key: AES keys that may leave only, the next free key id proposed, a bad id refused in words", async () => {
    const api = detail(db(), {
      "POST /api/v1/databases/:name/grants": ({ body }) => json(201, grant({ ...(body as { key_id: number }), key_name: "reports-tde" })),
    });
    openDetail();
    const form = await openGrant();
    const id = within(form).getByRole("textbox", { name: /MariaDB key id/ });
    expect(id).toHaveValue("2"); // 1 is taken
    expect(within(form).getByText(/1 is MariaDB's default key/)).toBeInTheDocument();
    await userEvent.click(within(form).getByRole("textbox", { name: /^Key/ }));
    expect(await screen.findByRole("option", { name: "reports-tde" })).toBeInTheDocument();
    expect(screen.queryByRole("option", { name: "signing-rsa" })).toBeNull();
    expect(screen.queryByRole("option", { name: "locked-aes" })).toBeNull();
    await userEvent.click(screen.getByRole("option", { name: "reports-tde" }));
    const submit = within(form).getByTestId("grant-key-submit");
    for (const [typed, said] of [
      ["0", /from 1 to 4,294,967,295/], ["4294967296", /from 1 to 4,294,967,295/], ["1.5", /digits only/],
      ["", /Required/], ["1", /Key id 1 is granted already/],
    ] as const) {
      await fill(id, typed);
      expect(within(form).getByText(said)).toBeInTheDocument();
      expect(submit).toBeDisabled();
    }
    await fill(id, "4294967295");
    expect(submit).toBeEnabled();
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/databases/:name/grants")).toHaveLength(1));
    expect(api.calls("POST /api/v1/databases/:name/grants")[0].body).toEqual(
      { key: "7703c18c-39c3-4619-bb48-e05423636617", key_id: 4294967295 });
    await waitFor(() => expect(screen.queryByRole("form", { name: "Grant a key to payments-db-01" })).toBeNull());
  });

  it("a grant held by the two-person rule says so and where it waits", async () => {
    const detailText = "database.grant needs 1 approval(s) from people with keys:export; request 5f2c… created";
    detail(db({ grants: [] }), {
      "POST /api/v1/databases/:name/grants": () => json(202, { status: "pending", code: "approval_required", detail: detailText,
                                                              request_id: "req-1", approval: {} }),
    });
    openDetail();
    const form = await openGrant();
    expect(within(form).getByRole("textbox", { name: /MariaDB key id/ })).toHaveValue("1");
    await pickKey(form, "payments-tde");
    await userEvent.click(within(form).getByTestId("grant-key-submit"));
    const held = await screen.findByTestId("grant-held");
    expect(held).toHaveTextContent("Waiting for approval");
    expect(held).toHaveTextContent(detailText);
    expect(held).toHaveTextContent("until then payments-db-01 cannot read the key");
    expect(within(held).getByRole("link", { name: "Open approvals" })).toHaveAttribute("href", "/approvals");
  });

  it("shows the server's refusal of a grant with what to do next, and keeps the form", async () => {
    detail(db({ grants: [] }), {
      "POST /api/v1/databases/:name/grants": () => problem(409, "key_not_active",
        "key 'payments-tde' is deactivated: a database needs an Active key (activate it, or grant another key)"),
    });
    openDetail();
    const form = await openGrant();
    await pickKey(form, "payments-tde");
    await userEvent.click(within(form).getByTestId("grant-key-submit"));
    const alert = await within(form).findByRole("alert");
    expect(alert).toHaveTextContent("Key not granted");
    expect(alert).toHaveTextContent("a database needs an Active key");
    expect(alert).toHaveTextContent("Activate the key on its page, or grant another key.");
  });

  it("removes a grant after confirming, naming what it does to MariaDB", async () => {
    const api = detail(db(), { "DELETE /api/v1/databases/:name/grants/:id": () => new Response(null, { status: 204 }) });
    openDetail();
    await userEvent.click(await screen.findByRole("button", { name: "Remove key id 1 (payments-tde) from payments-db-01" }));
    const dialog = await screen.findByRole("dialog", { name: "Remove key id 1 from payments-db-01" });
    expect(dialog).toHaveTextContent("with key id 1 that is usually all of them");
    await userEvent.click(within(dialog).getByTestId("remove-grant-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/databases/:name/grants/:id")).toHaveLength(1));
    expect(api.calls("DELETE /api/v1/databases/:name/grants/:id")[0].params).toEqual({ name: "payments-db-01", id: "1" });
  });

  it("issues a new token after confirming, and shows it once", async () => {
    const api = detail(db(), { "POST /api/v1/databases/:name/token": () => issued(db()) });
    openDetail();
    await userEvent.click(await screen.findByTestId("reissue-token"));
    const confirm = await screen.findByRole("dialog", { name: "Issue a new token for payments-db-01" });
    expect(confirm).toHaveTextContent("The current token stops working at once");
    await userEvent.click(within(confirm).getByTestId("reissue-token-confirm"));
    const shown = await screen.findByRole("dialog", { name: "New token for payments-db-01" });
    expect(within(shown).getByTestId("database-token-value")).toHaveTextContent("srdb_abc_SECRET");
    expect(shown).toHaveTextContent("The previous token stopped working when this one was made.");
    expect(api.calls("POST /api/v1/databases/:name/token")).toHaveLength(1);
  });

  it("revokes only after the name is typed", async () => {
    const api = detail(db(), { "POST /api/v1/databases/:name/revoke": () => db({ revoked_at: ago(0) }) });
    openDetail();
    await userEvent.click(await screen.findByTestId("revoke-database"));
    const submit = await screen.findByTestId("typed-confirm-submit");
    await fill(screen.getByTestId("typed-confirm-input"), "payments-db");
    expect(submit).toBeDisabled();
    await fill(screen.getByTestId("typed-confirm-input"), "payments-db-01");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/databases/:name/revoke")).toHaveLength(1));
  });

  it("granting needs keys:export too: without it the button says why", async () => {
    detail(db());
    const admin = meAs("admin");
    renderWith(<DatabaseDetailPage />, { at: "/databases/payments-db-01", path: "/databases/:name",
                                         me: { ...admin, permissions: admin.permissions.filter((p) => p !== "keys:export") } });
    const grantButton = await screen.findByTestId("grant-key");
    expect(grantButton).toBeDisabled();
    expect(grantButton).toHaveAttribute("title", "Requires the keys:export permission");
    expect(screen.getByTestId("revoke-database")).toBeEnabled();
  });

  it("a revoked database says what that means, and offers no action", async () => {
    detail(db({ revoked_at: ago(60) }));
    openDetail();
    expect(await screen.findByTestId("database-revoked")).toHaveTextContent("after that it cannot open its encrypted tables");
    expect(screen.queryByTestId("grant-key")).toBeNull();
    expect(screen.queryByTestId("revoke-database")).toBeNull();
  });

  it("a database that does not exist says where to go", async () => {
    fakeApi({ "GET /api/v1/databases/:name": () => problem(404, "database_not_found", "no database identity named 'payments-db-01'") });
    openDetail();
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("no database identity named 'payments-db-01'");
    expect(alert).toHaveTextContent("go back to the list");
  });
});

describe("the configuration's CA file", () => {
  it("is read from the my.cnf section, or not at all", () => {
    expect(caFileOf(CONFIG)).toBe("/etc/mysql/strongroom-ca.pem");
    expect(caFileOf("[mariadb]\n# hashicorp-key-management-vault-ca is not needed\n")).toBeNull();
  });
});

describe("key ids", () => {
  it("are whole numbers 1..4294967295, not already used", () => {
    expect(keyIdError("1")).toBeNull();
    expect(keyIdError(" 42 ")).toBeNull();
    expect(keyIdError("4294967295")).toBeNull();
    expect(keyIdError("4294967296")).toMatch(/32-bit/);
    expect(keyIdError("-1")).toMatch(/digits only/);
    expect(keyIdError("1e3")).toMatch(/digits only/);
    expect(keyIdError("3", [1, 3])).toMatch(/granted already/);
  });
  it("the next free one starts at MariaDB's default", () => {
    expect(nextKeyId([])).toBe(1);
    expect(nextKeyId([{ key_id: 1 }, { key_id: 2 }, { key_id: 5 }])).toBe(3);
  });
});
