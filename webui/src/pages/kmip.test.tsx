import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
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
  not_after: inDays(365), created_at: inDays(-2), created_by: "admin", revoked_at: null, key_export: "plaintext", ...over,
});
const CLIENTS = [client({}), client({ id: "2", name: "tde.db.example.com", not_after: inDays(10), key_export: "wrapped" }),
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
