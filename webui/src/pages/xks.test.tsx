import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { NAV, mayOpen } from "../nav";
import { fakeApi, json, problem } from "../test/fakeApi";
import { ROLE_PERMS, meAs, renderWith } from "../test/render";
import { externalIdError, regionError, storeNameError, subjectError, type XksKey, type XksStore } from "../xks";
import { XksStoreDetailPage } from "./XksStoreDetail";
import { XksStoresPage } from "./XksStores";

/** Replace a field's text as a paste does (a render per key is slow on a loaded machine). */
async function fill(field: HTMLElement, text: string) {
  await userEvent.clear(field);
  if (text) await userEvent.paste(text);
}

const ago = (minutes: number) => new Date(Date.now() - minutes * 60_000).toISOString();
const KEY_UUID = "6603c18c-39c3-4619-bb48-e05423636617";
const xkey = (over: Partial<XksKey> = {}): XksKey => ({
  external_id: "orders", key_name: "aws-xks-orders", key_uuid: KEY_UUID, granted_at: ago(120), granted_by: "admin1",
  last_used_at: ago(5), ...over,
});
const store = (over: Partial<XksStore> = {}): XksStore => ({
  id: "11111111-1111-4111-8111-111111111111", name: "aws-prod", description: "Orders account", region: "eu-west-1",
  access_key_id: "SRXKSCURRENT0001", credential_issued_at: ago(3 * 24 * 60), previous_access_key_id: null,
  client_cert_subject: null, created_at: ago(10 * 24 * 60), created_by: "admin1", last_seen_at: ago(5),
  revoked_at: null, uri_path_prefix: `/xks/${over.name ?? "aws-prod"}`, keys: [xkey()], ...over,
});
const page = (items: XksStore[]) => ({ items, total: items.length, limit: items.length, offset: 0 });
const issued = (s: XksStore, access = s.access_key_id) => ({
  store: s, access_key_id: access, secret_access_key: "xks-SECRET-shown-once",
  proxy_uri_endpoint: "https://kms.example.net", proxy_uri_path: `${s.uri_path_prefix}/kms/xks/v1`,
});
const key = (over: Partial<Key>): Key => ({
  id: KEY_UUID, name: "aws-xks-orders", description: "", owner: "", tags: {}, algorithm: "AES", length_bits: 256,
  state: "active", current_version: 2, created_at: ago(900), updated_at: ago(60), rotation_period_days: 90,
  next_rotation_at: null, exportable: false, kmip_group: null, versions: [], ...over,
});
const KEYS = [key({}), key({ id: "7703c18c-39c3-4619-bb48-e05423636617", name: "billing", current_version: 1 }),
              key({ id: "8803c18c-39c3-4619-bb48-e05423636617", name: "aes128", length_bits: 128 }),
              key({ id: "9903c18c-39c3-4619-bb48-e05423636617", name: "signing-rsa", algorithm: "RSA", length_bits: 3072 }),
              key({ id: "aa03c18c-39c3-4619-bb48-e05423636617", name: "bad name!" })];

describe("the navigation", () => {
  it("shows AWS key stores next to Databases, to roles with xks:read only", () => {
    const labels = NAV.map((n) => n.label);
    expect(labels.indexOf("AWS key stores")).toBe(labels.indexOf("Databases") + 1);
    const entry = NAV.find((n) => n.label === "AWS key stores")!;
    const may = (role: string) => mayOpen(entry, (p) => ROLE_PERMS[role].includes(p));
    expect(may("admin")).toBe(true);
    expect(may("key-officer")).toBe(true);
    expect(may("auditor")).toBe(true);
    expect(may("operator")).toBe(false);
  });
});

describe("AWS key stores page", () => {
  it("lists each store's region, state, keys, credential age and mutual TLS; an auditor cannot connect one", async () => {
    fakeApi({ "GET /api/v1/xks/stores": page([
      store(),
      store({ id: "2", name: "aws-test", region: "us-east-1", keys: [], last_seen_at: null,
              client_cert_subject: "cks.kms.us-east-1.amazonaws.com", previous_access_key_id: "SRXKSOLD" }),
      store({ id: "3", name: "aws-old", revoked_at: ago(60) }),
    ]) });
    renderWith(<XksStoresPage />, { me: meAs("auditor") });
    const table = await screen.findByTestId("xks-table");
    const prod = within(table).getByText("aws-prod").closest("tr")!;
    expect(prod).toHaveTextContent("eu-west-1");
    expect(within(prod).getByText("active")).toBeInTheDocument();
    expect(within(prod).getByTestId("xks-keys-count")).toHaveTextContent("1");
    expect(within(prod).getByTestId("xks-credential-age")).toHaveTextContent("3 days ago");
    expect(within(prod).getByTestId("xks-mtls")).toHaveTextContent("off");
    expect(within(prod).getByRole("link", { name: "aws-prod" })).toHaveAttribute("href", "/aws-key-stores/aws-prod");
    const test = within(table).getByText("aws-test").closest("tr")!;
    expect(within(test).getByTestId("xks-keys-count")).toHaveTextContent("none: AWS KMS can use no key");
    expect(within(test).getByTestId("xks-mtls")).toHaveTextContent("on");
    expect(within(test).getByTestId("xks-credential-age")).toHaveTextContent("previous one still accepted");
    expect(within(test).getByText("never")).toBeInTheDocument();
    expect(within(within(table).getByText("aws-old").closest("tr")!).getByText("revoked")).toBeInTheDocument();
    expect(screen.queryByTestId("connect-xks")).toBeNull();
    expect(screen.getByTestId("xks-total")).toHaveTextContent("3 key stores");
  });

  it("explains how to start when there is none", async () => {
    fakeApi({ "GET /api/v1/xks/stores": page([]) });
    renderWith(<XksStoresPage />, { me: meAs("key-officer") });
    expect(await screen.findByText("No AWS key store connected yet")).toBeInTheDocument();
    expect(screen.getByRole("button", { name: "Connect the first key store" })).toBeInTheDocument();
  });

  it("connects a key store and shows its credential once, with the proxy URI for AWS KMS and what to do next", async () => {
    const api = fakeApi({
      "GET /api/v1/xks/stores": page([]),
      "POST /api/v1/xks/stores": ({ body }) => {
        const b = body as { name: string; region: string };
        return json(201, issued(store({ name: b.name, region: b.region, uri_path_prefix: `/xks/${b.name}`, keys: [] })));
      },
    });
    renderWith(<XksStoresPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("connect-xks"));
    const form = await screen.findByRole("form", { name: "Connect a key store" });
    const name = within(form).getByRole("textbox", { name: /^Name/ });
    const region = within(form).getByRole("textbox", { name: /AWS region/ });
    const submit = within(form).getByTestId("connect-xks-submit");
    await fill(name, "AWS Prod");
    expect(within(form).getByText(/lower-case letters, digits, '.', '_' or '-', beginning and ending/)).toBeInTheDocument();
    await fill(name, "aws-prod");
    await fill(region, "Ireland");
    expect(within(form).getByText(/An AWS region name such as eu-west-1/)).toBeInTheDocument();
    expect(submit).toBeDisabled();
    await fill(region, "eu-west-1");
    expect(submit).toBeEnabled();
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/xks/stores")).toHaveLength(1));
    // No subject typed: none sent (SigV4 alone).
    expect(api.calls("POST /api/v1/xks/stores")[0].body).toEqual({ name: "aws-prod", region: "eu-west-1", description: "" });
    const shown = await screen.findByRole("dialog", { name: "aws-prod connected" });
    expect(within(shown).getByText("The secret access key is shown this once")).toBeInTheDocument();
    expect(within(shown).getByTestId("xks-access-key-id")).toHaveTextContent("SRXKSCURRENT0001");
    expect(within(shown).getByTestId("xks-secret")).toHaveTextContent("xks-SECRET-shown-once");
    expect(within(shown).getByRole("button", { name: "Copy the secret access key" })).toBeInTheDocument();
    expect(within(shown).getByTestId("xks-endpoint")).toHaveTextContent("https://kms.example.net");
    expect(within(shown).getByTestId("xks-path")).toHaveTextContent("/xks/aws-prod/kms/xks/v1");
    expect(shown).toHaveTextContent("Grant the store a Strongroom AES-256 key");
    expect(shown).toHaveTextContent("create a KMS key in it with the external key id granted here");
    expect(shown).not.toHaveTextContent("Mutual TLS is required");
    // Dismissed by its own button only; once closed the secret is gone from the page.
    expect(within(shown).queryByRole("button", { name: "Close dialog" })).toBeNull();
    await userEvent.click(within(shown).getByTestId("xks-credential-done"));
    await waitFor(() => expect(screen.queryByText("xks-SECRET-shown-once")).toBeNull());
  });

  it("a client certificate subject is checked as the server does, sent, and the next steps name the XKS port", async () => {
    const api = fakeApi({
      "GET /api/v1/xks/stores": page([]),
      "POST /api/v1/xks/stores": ({ body }) => json(201, issued(store({ keys: [],
        client_cert_subject: (body as { client_cert_subject: string }).client_cert_subject.toLowerCase() }))),
    });
    renderWith(<XksStoresPage />, { me: meAs("key-officer") });
    await userEvent.click(await screen.findByTestId("connect-xks"));
    const form = await screen.findByRole("form", { name: "Connect a key store" });
    await fill(within(form).getByRole("textbox", { name: /^Name/ }), "aws-prod");
    await fill(within(form).getByRole("textbox", { name: /AWS region/ }), "eu-west-1");
    const subject = within(form).getByTestId("xks-subject-input");
    expect(form).toHaveTextContent("AWS KMS's certificate names cks.kms.eu-west-1.amazonaws.com");
    const submit = within(form).getByTestId("connect-xks-submit");
    for (const bad of ["*.kms.eu-west-1.amazonaws.com", "cks kms", "-cks.example", "a".repeat(64) + ".example"]) {
      await fill(subject, bad);
      expect(within(form).getByText(/A DNS name without wildcards, such as cks.kms.eu-west-1.amazonaws.com/)).toBeInTheDocument();
      expect(submit).toBeDisabled();
    }
    await fill(subject, "CKS.kms.eu-west-1.amazonaws.com");
    expect(submit).toBeEnabled();
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/xks/stores")).toHaveLength(1));
    expect(api.calls("POST /api/v1/xks/stores")[0].body).toEqual(
      { name: "aws-prod", region: "eu-west-1", description: "", client_cert_subject: "CKS.kms.eu-west-1.amazonaws.com" });
    const shown = await screen.findByRole("dialog", { name: "aws-prod connected" });
    expect(shown).toHaveTextContent("Mutual TLS is required (subject cks.kms.eu-west-1.amazonaws.com)");
    expect(shown).toHaveTextContent("XKS port");
  });

  it("shows the server's refusal with what to do", async () => {
    const api = fakeApi({
      "GET /api/v1/xks/stores": page([]),
      "POST /api/v1/xks/stores": () => problem(409, "xks_store_exists", "an external key store named 'aws-prod' exists"),
    });
    renderWith(<XksStoresPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("connect-xks"));
    const form = await screen.findByRole("form", { name: "Connect a key store" });
    await fill(within(form).getByRole("textbox", { name: /^Name/ }), "aws-prod");
    await fill(within(form).getByRole("textbox", { name: /AWS region/ }), "eu-west-1");
    await userEvent.click(within(form).getByTestId("connect-xks-submit"));
    const alert = await within(form).findByRole("alert");
    expect(alert).toHaveTextContent("Key store not connected");
    expect(alert).toHaveTextContent("an external key store named 'aws-prod' exists");
    expect(alert).toHaveTextContent("a revoked key store keeps its name");
    expect(api.calls("POST /api/v1/xks/stores")).toHaveLength(1);
  });

  it("says what went wrong when the list cannot be loaded", async () => {
    fakeApi({ "GET /api/v1/xks/stores": () => problem(503, "database_unavailable", "the store is not reachable") });
    renderWith(<XksStoresPage />, { me: meAs("admin") });
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("AWS key stores could not be loaded");
    expect(alert).toHaveTextContent("retry shortly or check /readyz");
  });
});

function detail(s: XksStore, more: Parameters<typeof fakeApi>[0] = {}) {
  return fakeApi({
    "GET /api/v1/xks/stores/:name": s,
    "GET /api/v1/keys": ({ url }) => {
      const q = url.searchParams.get("q") ?? "";
      const items = KEYS.filter((k) => k.name.includes(q));
      return { items, total: items.length, limit: 50, offset: 0 };
    },
    ...more,
  });
}
const openDetail = (role: "admin" | "auditor" = "admin") =>
  renderWith(<XksStoreDetailPage />, { at: "/aws-key-stores/aws-prod", path: "/aws-key-stores/:name", me: meAs(role) });

async function openGrant() {
  await userEvent.click(await screen.findByTestId("xks-grant-key"));
  return screen.findByRole("form", { name: "Grant a key to aws-prod" });
}

describe("An AWS key store's page", () => {
  it("shows its keys, proxy path, credential and mutual TLS; read-only for an auditor", async () => {
    detail(store({ keys: [xkey({ external_id: "zeta", key_name: "billing", last_used_at: null }), xkey()] }));
    openDetail("auditor");
    const table = await screen.findByTestId("xks-keys-table");
    const rows = within(table).getAllByRole("row").slice(1);
    expect(rows[0]).toHaveTextContent("orders");
    expect(within(rows[0]).getByRole("link", { name: "aws-xks-orders" })).toHaveAttribute("href", `/keys/${KEY_UUID}`);
    expect(rows[1]).toHaveTextContent("never");
    expect(screen.getByTestId("xks-detail-path")).toHaveTextContent("/xks/aws-prod/kms/xks/v1");
    expect(screen.getByTestId("xks-current-key-id")).toHaveTextContent("SRXKSCURRENT0001");
    expect(screen.getByTestId("xks-mtls-state")).toHaveTextContent("Off: calls are authenticated by their SigV4 signature alone");
    for (const id of ["xks-grant-key", "revoke-xks", "rotate-xks-credential", "xks-mtls-change"]) {
      expect(screen.queryByTestId(id)).toBeNull();
    }
    expect(within(table).queryByRole("button", { name: /Remove/ })).toBeNull();
  });

  it("grants a key: active AES-256 keys only, the key's name proposed as external key id, a bad id refused", async () => {
    const api = detail(store(), {
      "POST /api/v1/xks/stores/:name/keys": ({ body }) => json(201, xkey({ external_id: (body as { external_id: string }).external_id,
                                                                           key_name: "billing" })),
    });
    openDetail();
    const form = await openGrant();
    await userEvent.click(within(form).getByRole("textbox", { name: /^Key/ }));
    expect(await screen.findByRole("option", { name: "billing" })).toBeInTheDocument();
    expect(screen.queryByRole("option", { name: "aes128" })).toBeNull();
    expect(screen.queryByRole("option", { name: "signing-rsa" })).toBeNull();
    await userEvent.click(screen.getByRole("option", { name: "billing" }));
    const id = within(form).getByTestId("xks-grant-external-id");
    expect(id).toHaveValue("billing");
    const submit = within(form).getByTestId("xks-grant-submit");
    for (const [typed, said] of [["", /1 to 128 letters/], ["has space", /1 to 128 letters/], ["x".repeat(129), /1 to 128 letters/],
                                 ["orders", /already has external key id orders/]] as const) {
      await fill(id, typed);
      expect(within(form).getByText(said)).toBeInTheDocument();
      expect(submit).toBeDisabled();
    }
    await fill(id, "billing-2026");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/xks/stores/:name/keys")).toHaveLength(1));
    expect(api.calls("POST /api/v1/xks/stores/:name/keys")[0].body).toEqual(
      { key: "7703c18c-39c3-4619-bb48-e05423636617", external_id: "billing-2026" });
    await waitFor(() => expect(screen.queryByRole("form", { name: "Grant a key to aws-prod" })).toBeNull());
  });

  it("a key whose name is no valid external key id asks for one", async () => {
    detail(store({ keys: [] }));
    openDetail();
    const form = await openGrant();
    await userEvent.click(within(form).getByRole("textbox", { name: /^Key/ }));
    await userEvent.click(await screen.findByRole("option", { name: "bad name!" }));
    expect(within(form).getByText(/1 to 128 letters/)).toBeInTheDocument();
    expect(within(form).getByTestId("xks-grant-submit")).toBeDisabled();
  });

  it("shows the server's refusal of a grant with what to do next", async () => {
    detail(store({ keys: [] }), {
      "POST /api/v1/xks/stores/:name/keys": () => problem(409, "key_not_active", "key 'aws-xks-orders' is deactivated: grant an Active key"),
    });
    openDetail();
    const form = await openGrant();
    await userEvent.click(within(form).getByRole("textbox", { name: /^Key/ }));
    await userEvent.click(await screen.findByRole("option", { name: "aws-xks-orders" }));
    await userEvent.click(within(form).getByTestId("xks-grant-submit"));
    const alert = await within(form).findByRole("alert");
    expect(alert).toHaveTextContent("Key not granted");
    expect(alert).toHaveTextContent("grant an Active key");
    expect(alert).toHaveTextContent("Activate the key on its page, or grant another key.");
  });

  it("removes a key after saying what AWS KMS will get", async () => {
    const api = detail(store(), { "DELETE /api/v1/xks/stores/:name/keys/:id": () => new Response(null, { status: 204 }) });
    openDetail();
    await userEvent.click(await screen.findByRole("button", { name: "Remove orders (aws-xks-orders) from aws-prod" }));
    const dialog = await screen.findByRole("dialog", { name: "Remove orders from aws-prod" });
    expect(dialog).toHaveTextContent("AWS KMS gets \"key not found\" for external key id orders");
    await userEvent.click(within(dialog).getByTestId("remove-xks-key-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/xks/stores/:name/keys/:id")).toHaveLength(1));
    expect(api.calls("DELETE /api/v1/xks/stores/:name/keys/:id")[0].params).toEqual({ name: "aws-prod", id: "orders" });
  });

  it("issues a new credential after confirming, shows the secret once, and says to retire the old one later", async () => {
    const api = detail(store(), {
      "POST /api/v1/xks/stores/:name/credential": () => issued(store({ access_key_id: "SRXKSNEW0002",
                                                                        previous_access_key_id: "SRXKSCURRENT0001" })),
    });
    openDetail();
    await userEvent.click(await screen.findByTestId("rotate-xks-credential"));
    const confirm = await screen.findByRole("dialog", { name: "Issue a new credential for aws-prod" });
    expect(confirm).toHaveTextContent("The current one, SRXKSCURRENT0001, stays accepted until you retire it");
    expect(within(confirm).queryByTestId("rotate-drops-oldest")).toBeNull();
    await userEvent.click(within(confirm).getByTestId("rotate-xks-confirm"));
    const shown = await screen.findByRole("dialog", { name: "New credential for aws-prod" });
    expect(within(shown).getByTestId("xks-access-key-id")).toHaveTextContent("SRXKSNEW0002");
    expect(within(shown).getByTestId("xks-secret")).toHaveTextContent("xks-SECRET-shown-once");
    expect(shown).toHaveTextContent("The previous credential stays accepted until you retire it");
    expect(shown).toHaveTextContent("UpdateCustomKeyStore");
    expect(shown).toHaveTextContent("Then retire the previous credential");
    expect(within(shown).queryByRole("button", { name: "Close dialog" })).toBeNull();
    await userEvent.click(within(shown).getByTestId("xks-credential-done"));
    await waitFor(() => expect(screen.queryByText("xks-SECRET-shown-once")).toBeNull());
    expect(api.calls("POST /api/v1/xks/stores/:name/credential")).toHaveLength(1);
  });

  it("warns that a re-issue drops a previous credential not yet retired", async () => {
    detail(store({ previous_access_key_id: "SRXKSOLD0000" }));
    openDetail();
    await userEvent.click(await screen.findByTestId("rotate-xks-credential"));
    const confirm = await screen.findByRole("dialog", { name: "Issue a new credential for aws-prod" });
    expect(within(confirm).getByTestId("rotate-drops-oldest")).toHaveTextContent("SRXKSOLD0000, has not been retired");
  });

  it("retires the previous credential, explaining the grace, only when there is one", async () => {
    const api = detail(store({ previous_access_key_id: "SRXKSOLD0000" }), {
      "DELETE /api/v1/xks/stores/:name/credential/previous": () => store(),
    });
    openDetail();
    expect(await screen.findByTestId("xks-previous-key-id")).toHaveTextContent("SRXKSOLD0000 still accepted");
    await userEvent.click(screen.getByTestId("retire-xks-previous"));
    const dialog = await screen.findByRole("dialog", { name: "Retire the previous credential of aws-prod" });
    expect(dialog).toHaveTextContent("Access key id SRXKSOLD0000 is refused from now on");
    expect(dialog).toHaveTextContent("allow several minutes");
    await userEvent.click(within(dialog).getByTestId("retire-xks-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/xks/stores/:name/credential/previous")).toHaveLength(1));
  });

  it("no previous credential: nothing to retire", async () => {
    detail(store());
    openDetail();
    await screen.findByTestId("rotate-xks-credential");
    expect(screen.queryByTestId("retire-xks-previous")).toBeNull();
  });

  it("requires a client certificate subject: checked as the server does, a subject not AWS's flagged, then sent", async () => {
    const api = detail(store(), {
      "PATCH /api/v1/xks/stores/:name": ({ body }) => store({ client_cert_subject: (body as { client_cert_subject: string }).client_cert_subject }),
    });
    openDetail();
    await userEvent.click(await screen.findByTestId("xks-mtls-change"));
    const form = await screen.findByRole("form", { name: "Mutual TLS for aws-prod" });
    expect(form).toHaveTextContent("AWS KMS's for eu-west-1 is cks.kms.eu-west-1.amazonaws.com");
    const input = within(form).getByTestId("xks-mtls-input");
    const save = within(form).getByTestId("xks-mtls-save");
    expect(save).toBeDisabled();
    await fill(input, "*.amazonaws.com");
    expect(within(form).getByText(/A DNS name without wildcards/)).toBeInTheDocument();
    expect(save).toBeDisabled();
    await fill(input, "cks.kms.us-east-1.amazonaws.com");
    expect(within(form).getByTestId("xks-mtls-not-aws")).toHaveTextContent("AWS KMS's calls would be refused");
    await fill(input, "cks.kms.eu-west-1.amazonaws.com");
    expect(within(form).queryByTestId("xks-mtls-not-aws")).toBeNull();
    expect(within(form).queryByTestId("xks-mtls-off")).toBeNull(); // nothing to turn off yet
    await userEvent.click(save);
    await waitFor(() => expect(api.calls("PATCH /api/v1/xks/stores/:name")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/xks/stores/:name")[0].body).toEqual({ client_cert_subject: "cks.kms.eu-west-1.amazonaws.com" });
  });

  it("turns mutual TLS off by sending null", async () => {
    const api = detail(store({ client_cert_subject: "cks.kms.eu-west-1.amazonaws.com" }), {
      "PATCH /api/v1/xks/stores/:name": () => store(),
    });
    openDetail();
    expect(await screen.findByTestId("xks-mtls-state")).toHaveTextContent("On: every call must come over the XKS port");
    await userEvent.click(screen.getByTestId("xks-mtls-change"));
    const form = await screen.findByRole("form", { name: "Mutual TLS for aws-prod" });
    expect(within(form).getByTestId("xks-mtls-save")).toBeDisabled(); // unchanged
    await userEvent.click(within(form).getByTestId("xks-mtls-off"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/xks/stores/:name")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/xks/stores/:name")[0].body).toEqual({ client_cert_subject: null });
  });

  it("revokes only after the name is typed, saying AWS KMS can no longer use the keys", async () => {
    const api = detail(store(), { "POST /api/v1/xks/stores/:name/revoke": () => store({ revoked_at: ago(0) }) });
    openDetail();
    await userEvent.click(await screen.findByTestId("revoke-xks"));
    const dialog = await screen.findByRole("dialog", { name: "Revoke aws-prod" });
    expect(dialog).toHaveTextContent("AWS KMS can no longer use these keys");
    expect(dialog).toHaveTextContent("This cannot be undone.");
    const submit = within(dialog).getByTestId("typed-confirm-submit");
    await fill(within(dialog).getByTestId("typed-confirm-input"), "aws-pro");
    expect(submit).toBeDisabled();
    await fill(within(dialog).getByTestId("typed-confirm-input"), "aws-prod");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/xks/stores/:name/revoke")).toHaveLength(1));
  });

  it("a revoked store says what that means, and offers no action", async () => {
    detail(store({ revoked_at: ago(60), previous_access_key_id: "SRXKSOLD0000" }));
    openDetail();
    expect(await screen.findByTestId("xks-revoked")).toHaveTextContent("AWS KMS shows the store disconnected");
    for (const id of ["xks-grant-key", "revoke-xks", "rotate-xks-credential", "retire-xks-previous", "xks-mtls-change"]) {
      expect(screen.queryByTestId(id)).toBeNull();
    }
  });

  it("a store that does not exist says where to go", async () => {
    fakeApi({ "GET /api/v1/xks/stores/:name": () => problem(404, "xks_store_not_found", "no external key store named 'aws-prod'") });
    openDetail();
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("no external key store named 'aws-prod'");
    expect(alert).toHaveTextContent("go back to the list");
  });
});

describe("the server's rules, checked while typing", () => {
  it("names, regions, subjects and external key ids", () => {
    expect(storeNameError("aws-prod")).toBeNull();
    expect(storeNameError("a")).toBeNull();
    expect(storeNameError("-aws")).toMatch(/beginning and ending/);
    expect(storeNameError("Aws")).toMatch(/lower-case/);
    expect(storeNameError("a".repeat(65))).toBe("At most 64 characters; this one has 65");
    expect(regionError("eu-west-1")).toBeNull();
    expect(regionError("us-gov-west-1")).toBeNull();
    expect(regionError("eu-west")).toMatch(/eu-west-1/);
    expect(subjectError("")).toBeNull();
    expect(subjectError("CKS.kms.eu-west-1.amazonaws.com")).toBeNull();
    expect(subjectError("cks.kms.eu-west-1.amazonaws.com.")).toMatch(/DNS name/);
    expect(subjectError("*.amazonaws.com")).toMatch(/without wildcards/);
    expect(subjectError(`${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(63)}`)).toMatch(/253/);
    expect(externalIdError("orders.v2_x-1")).toBeNull();
    expect(externalIdError("a/b")).toMatch(/1 to 128/);
    expect(externalIdError("orders", ["orders"])).toMatch(/already has/);
  });
});
