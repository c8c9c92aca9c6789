import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import type { KmipGrant } from "../kmip";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { KeyDetailPage } from "./KeyDetail";
import { KeyKmipPanel } from "./KeyKmip";
import { KeysPage } from "./Keys";

/** Replace a field's text as a paste does (a render per key is slow on a loaded machine). */
async function fill(field: HTMLElement, text: string) {
  await userEvent.clear(field);
  if (text) await userEvent.paste(text);
}

const KEY_ID = "6603c18c-39c3-4619-bb48-e05423636617";
const key: Key = {
  id: KEY_ID, name: "payments-db", description: "", owner: "alice", tags: {}, kmip_group: "backups",
  algorithm: "AES", length_bits: 256, state: "active", current_version: 1, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, versions: [],
};
const GROUPS = [{ name: "backups", clients: ["backup-01.example.com", "backup-02.example.com"], objects: 4 },
                { name: "vsphere", clients: ["vcenter-a.example.com"], objects: 2 }];
const GRANT: KmipGrant = {
  id: "0b9f2c1e-0000-4000-8000-000000000001", grantee: "client:vcenter-a.example.com", target_kind: "key", target: KEY_ID,
  target_name: "payments-db", rights: ["read", "use"], created_by: "admin1", created_at: new Date(Date.now() - 3_600_000).toISOString(),
};
const NO_AUDIT = { items: [], total: 0, total_exact: true, next_before_seq: null };

describe("a key's KMIP access", () => {
  it("names its group's clients and lists the grants on it, with a way to grant more", async () => {
    const onGroup: KmipGrant = { ...GRANT, id: "0b9f2c1e-0000-4000-8000-000000000002", grantee: "group:vsphere", target_kind: "group",
                                 target: "backups", target_name: "backups", rights: ["read"] };
    const api = fakeApi({
      "GET /api/v1/kmip/groups": GROUPS,
      "GET /api/v1/kmip/grants": ({ url }) => (url.searchParams.get("key") === KEY_ID ? [GRANT]
        : url.searchParams.get("group") === "backups" ? [onGroup] : problem(400, "unexpected", url.search)),
    });
    renderWith(<KeyKmipPanel k={key} onEdit={() => undefined} />, { me: meAs("admin") });
    const panel = await screen.findByTestId("key-kmip");
    expect(await within(panel).findByText(/its clients \(backup-01.example.com, backup-02.example.com\) see it/)).toBeInTheDocument();
    const table = await within(panel).findByTestId("kmip-grants-table");
    expect(api.calls("GET /api/v1/kmip/grants")).toHaveLength(2);
    const direct = table.querySelector(`tr[data-grant="${GRANT.id}"]`) as HTMLElement;
    expect(direct).toHaveTextContent("vcenter-a.example.com");
    expect(within(direct).getByTestId("grant-rights")).toHaveTextContent("readuse");
    // A grant on the key's whole group reaches it as well, and says so.
    const viaGroup = table.querySelector(`tr[data-grant="${onGroup.id}"]`) as HTMLElement;
    expect(viaGroup).toHaveTextContent("groupvsphere");
    expect(viaGroup).toHaveTextContent("every object of groupbackups");
    expect(within(panel).getByTestId("key-kmip-grant")).toHaveAttribute("href", "/kmip-clients?view=grants&grant_key=payments-db");
  });

  it("says that no client sees a key without a group or grant; a read-only role gets no buttons", async () => {
    const api = fakeApi({ "GET /api/v1/kmip/groups": GROUPS, "GET /api/v1/kmip/grants": [] });
    renderWith(<KeyKmipPanel k={{ ...key, kmip_group: null }} onEdit={() => undefined} />, { me: meAs("auditor") });
    const panel = await screen.findByTestId("key-kmip");
    expect(within(panel).getByTestId("key-kmip-group")).toHaveTextContent("No KMIP group: no KMIP client sees this key except through a grant.");
    expect(await within(panel).findByTestId("key-kmip-no-grants")).toHaveTextContent("No grant on this key.");
    expect(within(panel).queryByRole("button")).toBeNull();
    expect(within(panel).queryByRole("link")).toBeNull();
    expect(api.calls("GET /api/v1/kmip/grants").map((c) => c.url.search)).toEqual([`?key=${KEY_ID}`]); // no group to ask about
  });

  it("sets, checks and clears the key's group in Edit details, saying what changes for clients", async () => {
    let current = key;
    const api = fakeApi({
      "GET /api/v1/keys/:ref": () => current,
      "PATCH /api/v1/keys/:ref": ({ body }) => { current = { ...current, ...(body as object) }; return current; },
      "GET /api/v1/kmip/groups": GROUPS, "GET /api/v1/kmip/grants": [], "GET /api/v1/audit/events": NO_AUDIT,
      "GET /api/v1/keys/:ref/consumers": { items: [] },
    });
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("key-kmip-group-edit"));
    const form = await screen.findByRole("form", { name: "Edit key details" });
    const group = within(form).getByRole("textbox", { name: "KMIP group" });
    expect(group).toHaveValue("backups");
    await fill(group, "VSphere");
    expect(within(form).getByText("Lower case only: vsphere")).toBeInTheDocument();
    expect(screen.getByTestId("save-key-details")).toBeDisabled();
    await fill(group, "vsphere");
    expect(within(form).getByTestId("kmip-group-change")).toHaveTextContent(
      /clients of group backups no longer see this key from their next request.*Clients of group vsphere see it/);
    await userEvent.click(screen.getByTestId("save-key-details"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/keys/:ref")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/keys/:ref")[0].body).toEqual({ kmip_group: "vsphere" });
    await waitFor(() => expect(screen.queryByRole("form", { name: "Edit key details" })).toBeNull());
    expect(await screen.findByText(/its clients \(vcenter-a.example.com\) see it/)).toBeInTheDocument();
    // Emptied, the group is cleared (null), not sent as "".
    await userEvent.click(screen.getByTestId("edit-key"));
    const again = await screen.findByRole("form", { name: "Edit key details" });
    await fill(within(again).getByRole("textbox", { name: "KMIP group" }), "");
    expect(within(again).getByTestId("kmip-group-change")).toHaveTextContent("No KMIP client sees it except through a grant.");
    await userEvent.click(screen.getByTestId("save-key-details"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/keys/:ref")).toHaveLength(2));
    expect(api.calls("PATCH /api/v1/keys/:ref")[1].body).toEqual({ kmip_group: null });
  });

  it("creates a key in a KMIP group; a name the server would refuse is refused before sending", async () => {
    const api = fakeApi({
      "GET /api/v1/keys": { items: [], total: 0, limit: 25, offset: 0 }, "GET /api/v1/kmip/groups": GROUPS,
      "POST /api/v1/keys": ({ body }) => json(201, { ...key, ...(body as object) }),
    });
    renderWith(<KeysPage />, { me: meAs("admin"), at: "/keys", path: "/keys" });
    await userEvent.click(await screen.findByTestId("create-key"));
    const dialog = await screen.findByRole("dialog", { name: "Create key" });
    await fill(within(dialog).getByRole("textbox", { name: /^Name/ }), "vsphere-kek");
    const group = within(dialog).getByTestId("create-key-kmip-group");
    await fill(group, "vsphere prod");
    expect(within(dialog).getByText(/only \(not a space\)/)).toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create key" })).toBeDisabled();
    await fill(group, "vsphere");
    await userEvent.click(within(dialog).getByRole("button", { name: "Create key" }));
    await waitFor(() => expect(api.calls("POST /api/v1/keys")).toHaveLength(1));
    expect(api.calls("POST /api/v1/keys")[0].body).toMatchObject({ name: "vsphere-kek", kmip_group: "vsphere" });
  });
});
