// Grants on a standalone KMIP object (a public or private key, secret data, a certificate:
// no managed key, so no key page links here): made in the grant dialog by unique identifier,
// listed and revoked in the Grants view like any other grant.
import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { AuditEvent, Schemas } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { objectUidError, toObjectUid, type KmipGrant } from "../kmip";
import { RecordView } from "./Audit";
import { KmipClientsPage } from "./Kmip";

const UID = "0b8e2f5a-4c3d-4e1f-9a7b-6c5d4e3f2a1b";
const client: Schemas["KmipClientPublic"] = {
  id: "11111111-1111-4111-8111-111111111111", name: "backup-01.example.com", role: "kmip-client", serial: "5A1F",
  fingerprint_sha256: "ab".repeat(32), not_after: "2027-11-26T00:00:00Z", created_at: "2026-11-24T00:00:00Z",
  created_by: "admin", revoked_at: null, key_export: "plaintext", group: "backups",
};
const onObject: KmipGrant = {
  id: "0b9f2c1e-0000-4000-8000-000000000003", grantee: "group:vsphere", target_kind: "object", target: UID,
  target_name: "signing-cert", rights: ["read"], created_by: "admin1", created_at: "2026-11-25T00:00:00Z",
};

/** The Grants view with one grant on an object, and the grant dialog open on it. */
async function grantDialog(routes: Parameters<typeof fakeApi>[0] = {}, me = meAs("admin")) {
  const api = fakeApi({
    "GET /api/v1/kmip/clients": [client, { ...client, id: "2", name: "tde.db.example.com", group: "vsphere" }],
    "GET /api/v1/kmip/groups": [{ name: "backups", clients: ["backup-01.example.com"], objects: 2 },
                                { name: "vsphere", clients: ["tde.db.example.com"], objects: 1 }],
    "GET /api/v1/kmip/grants": [onObject],
    "GET /api/v1/keys": { items: [], total: 0, limit: 50, offset: 0 },
    ...routes,
  });
  renderWith(<KmipClientsPage />, { me, at: "/?view=grants" });
  await userEvent.click(await screen.findByTestId("grant-kmip-access"));
  const form = await screen.findByRole("form", { name: "Grant KMIP access" });
  return { api, form, submit: within(form).getByTestId("grant-kmip-submit") };
}

async function chooseGrantee(form: HTMLElement, name: string) {
  await userEvent.click(within(form).getByRole("textbox", { name: /^Grantee/ }));
  await userEvent.click(await screen.findByRole("option", { name }));
}

async function typeObject(form: HTMLElement, text: string) {
  const field = within(form).getByRole("textbox", { name: /^Object's unique identifier/ });
  await userEvent.clear(field);
  if (text) {
    await userEvent.click(field);
    await userEvent.paste(text);
  }
  return field;
}

describe("granting access to a standalone KMIP object", () => {
  it("sends the object's unique identifier, as the server writes it, with the rights chosen", async () => {
    const { api, form, submit } = await grantDialog({
      "POST /api/v1/kmip/grants": ({ body }) => json(201, { ...onObject, id: "new", ...(body as object), target: UID }),
    });
    await chooseGrantee(form, "backup-01.example.com");
    await userEvent.click(within(form).getByRole("radio", { name: "One standalone object" }));
    expect(form).toHaveTextContent("the audit log shows it as the object ID of kmip.register and kmip.create_key_pair");
    expect(submit).toBeDisabled(); // no object yet
    await typeObject(form, UID.toUpperCase().replace(/-/g, ""));
    await userEvent.click(within(form).getByRole("checkbox", { name: /^use/ }));
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/kmip/grants")).toHaveLength(1));
    expect(api.calls("POST /api/v1/kmip/grants")[0].body).toEqual(
      { grantee: "client:backup-01.example.com", object: UID, rights: ["read", "use"] });
    await waitFor(() => expect(screen.queryByRole("form", { name: "Grant KMIP access" })).toBeNull());
  });

  it("refuses what is no unique identifier before sending, saying what one looks like", async () => {
    const { api, form, submit } = await grantDialog();
    await chooseGrantee(form, "backup-01.example.com");
    await userEvent.click(within(form).getByRole("radio", { name: "One standalone object" }));
    const field = await typeObject(form, "signing-cert");
    expect(field).toHaveAccessibleDescription(/hexadecimal digits \(0-9, a-f\) and hyphens only/);
    expect(submit).toBeDisabled();
    await typeObject(form, UID.slice(0, 20));
    expect(within(form).getByText("A unique identifier has 32 hexadecimal digits; this one has 17")).toBeInTheDocument();
    expect(submit).toBeDisabled();
    expect(api.calls("POST /api/v1/kmip/grants")).toHaveLength(0);
  });

  it("says the grantee has a grant on that object already, however the identifier is typed", async () => {
    const { form, submit } = await grantDialog();
    await chooseGrantee(form, "vsphere");
    await userEvent.click(within(form).getByRole("radio", { name: "One standalone object" }));
    await typeObject(form, UID.toUpperCase());
    expect(await within(form).findByTestId("grant-duplicate")).toHaveTextContent(
      `vsphere has a grant on ${UID} already (read): revoke it first`);
    expect(submit).toBeDisabled();
  });

  it("shows the server's refusal of an unknown object with what to do next, and keeps what was typed", async () => {
    const { api, form, submit } = await grantDialog({
      "POST /api/v1/kmip/grants": () => problem(404, "object_not_found",
        `no standalone KMIP object '${UID}'; it is a version of key 6603c18c: grant the key (key=…)`),
    });
    await chooseGrantee(form, "backup-01.example.com");
    await userEvent.click(within(form).getByRole("radio", { name: "One standalone object" }));
    await typeObject(form, UID);
    await userEvent.click(submit);
    const alert = await within(form).findByRole("alert");
    expect(api.calls("POST /api/v1/kmip/grants")).toHaveLength(1);
    expect(alert).toHaveTextContent("Access not granted");
    expect(alert).toHaveTextContent("it is a version of key 6603c18c: grant the key");
    expect(alert).toHaveTextContent("Check the unique identifier with the KMIP client that made the object");
    expect(within(form).getByRole("textbox", { name: /^Object's unique identifier/ })).toHaveValue(UID);
  });

  it("does not offer export to a role that may not export keys", async () => {
    const me = meAs("admin");
    const { form } = await grantDialog({}, { ...me, permissions: me.permissions.filter((p) => p !== "keys:export") });
    await userEvent.click(within(form).getByRole("radio", { name: "One standalone object" }));
    expect(within(form).getByRole("checkbox", { name: /^export/ })).toBeDisabled();
  });
});

describe("from an object's audit record", () => {
  const record = (over: Partial<AuditEvent>): AuditEvent => ({
    seq: 7, time: "2026-11-26T10:00:00Z", actor: "kmip:backup-01.example.com", actor_type: "host", action: "kmip.register",
    outcome: "success", object_type: "certificate", object_id: UID, object_name: "signing-cert", source_ip: null,
    request_id: null, details: {}, prev_hash: "00", hash: "11", ...over,
  });

  it("links a standalone object's record to the grant dialog on that object, for those who may grant", () => {
    renderWith(<RecordView e={record({})} />, { me: meAs("admin") });
    expect(screen.getByRole("link", { name: "Grant KMIP access to this certificate" }))
      .toHaveAttribute("href", `#/kmip-clients?view=grants&grant_object=${UID}`);
  });

  it("offers no such link for a managed key, an unknown identifier, or a role that may not grant", () => {
    const { unmount } = renderWith(<RecordView e={record({ object_type: "key" })} />, { me: meAs("admin") });
    expect(screen.queryByTestId("audit-grant-object")).toBeNull();
    unmount();
    const second = renderWith(<RecordView e={record({ object_type: "kmip_object" })} />, { me: meAs("admin") });
    expect(screen.queryByTestId("audit-grant-object")).toBeNull();
    second.unmount();
    renderWith(<RecordView e={record({})} />, { me: meAs("auditor") });
    expect(screen.queryByTestId("audit-grant-object")).toBeNull();
  });

  it("the link opens the grant dialog on the object", async () => {
    fakeApi({ "GET /api/v1/kmip/clients": [client], "GET /api/v1/kmip/groups": [], "GET /api/v1/kmip/grants": [] });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: `/?view=grants&grant_object=${UID}` });
    const form = await screen.findByRole("form", { name: "Grant KMIP access" });
    expect(within(form).getByRole("radio", { name: "One standalone object" })).toBeChecked();
    expect(within(form).getByRole("textbox", { name: /^Object's unique identifier/ })).toHaveValue(UID);
  });
});

describe("a grant on a standalone object in the Grants view", () => {
  it("names the object and revokes the grant after confirmation", async () => {
    const api = fakeApi({
      "GET /api/v1/kmip/clients": [client], "GET /api/v1/kmip/groups": [], "GET /api/v1/kmip/grants": [onObject],
      "DELETE /api/v1/kmip/grants/:id": () => new Response(null, { status: 204 }),
    });
    renderWith(<KmipClientsPage />, { me: meAs("admin"), at: "/?view=grants" });
    const row = (await screen.findByTestId("kmip-grants-table")).querySelector(`tr[data-grant="${onObject.id}"]`) as HTMLElement;
    expect(row).toHaveTextContent("object");
    expect(within(row).getByText("signing-cert")).toHaveAttribute("title", UID);
    await userEvent.click(within(row).getByRole("button", { name: "Revoke the grant of signing-cert to vsphere" }));
    const dialog = await screen.findByRole("dialog", { name: "Revoke the grant of signing-cert to vsphere" });
    expect(dialog).toHaveTextContent("From its next request, no client of group vsphere can use these rights on signing-cert");
    await userEvent.click(within(dialog).getByTestId("revoke-grant-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/kmip/grants/:id")).toHaveLength(1));
    expect(api.calls("DELETE /api/v1/kmip/grants/:id")[0].params.id).toBe(onObject.id);
  });

  it("an auditor sees object grants but is offered neither grant nor revoke", async () => {
    fakeApi({ "GET /api/v1/kmip/clients": [], "GET /api/v1/kmip/groups": [], "GET /api/v1/kmip/grants": [onObject] });
    renderWith(<KmipClientsPage />, { me: meAs("auditor"), at: "/?view=grants" });
    expect(await screen.findByText("signing-cert")).toBeInTheDocument();
    expect(screen.queryByTestId("grant-kmip-access")).toBeNull();
    expect(screen.queryByRole("button", { name: /^Revoke the grant/ })).toBeNull();
  });
});

describe("object identifiers", () => {
  it("are 32 hexadecimal digits, hyphens optional, written lower case and hyphenated", () => {
    expect(objectUidError(UID)).toBeNull();
    expect(objectUidError(UID.replace(/-/g, "").toUpperCase())).toBeNull();
    expect(objectUidError("")).toMatch(/^Required/);
    expect(objectUidError("xyz")).toMatch(/hexadecimal digits \(0-9, a-f\)/);
    expect(toObjectUid(` ${UID.replace(/-/g, "").toUpperCase()} `)).toBe(UID);
  });
});
