import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { KeyDetailPage, tagChanges } from "./KeyDetail";

const key: Key = {
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-db", description: "Card vault", owner: "alice",
  tags: { env: "prod", "host-group": "db-servers" },
  algorithm: "AES", length_bits: 256, state: "active", current_version: 1, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null,
  versions: [{
    version: 1, state: "active", created_at: "2026-11-22T00:00:00Z", activation_date: "2026-11-22T00:00:00Z",
    deactivation_date: null, compromise_date: null, destroy_date: null, revocation_reason: null, revocation_message: null,
    wrapping_key_id: "kek-1", wrapping_mechanism: "RSA-OAEP-SHA1", replaces: null, replaced_by: null,
  }],
};

function server(patch?: (body: unknown) => unknown) {
  let current = key;
  return fakeApi({
    "GET /api/v1/keys/:ref": () => current,
    "PATCH /api/v1/keys/:ref": ({ body }) => {
      if (patch) return patch(body) as object;
      current = { ...current, ...(body as object) };
      return current;
    },
    "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null },
  });
}

const open = async () => {
  await userEvent.click(await screen.findByTestId("edit-key"));
  return screen.findByRole("form", { name: "Edit key details" });
};

describe("Editing a key's description, owner and tags", () => {
  it("sends only what changed, and the page shows the saved values", async () => {
    const api = server();
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await open();
    expect(screen.getByTestId("save-key-details")).toBeDisabled(); // nothing changed yet
    const owner = screen.getByLabelText("Owner");
    await userEvent.clear(owner); // focused: the paste lands there, whole (a render per key is slow on a busy machine)
    await userEvent.paste("payments-team");
    await userEvent.click(screen.getByTestId("save-key-details"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/keys/:ref")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/keys/:ref")[0].body).toEqual({ owner: "payments-team" });
    expect(await screen.findByText("payments-team")).toBeInTheDocument();
    // Opened again, the form starts from the saved key.
    await open();
    expect(screen.getByLabelText("Owner")).toHaveValue("payments-team");
  });

  it("says what a host-group change does to hosts, and sends the whole tag map", async () => {
    const api = server();
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    const form = await open();
    const tags = within(form).getByRole("textbox", { name: "Tags" });
    await userEvent.type(tags, "{Backspace}"); // the last tag, host-group=db-servers
    await userEvent.type(tags, "host-group=web-servers{Enter}");
    expect(await screen.findByTestId("host-group-change")).toHaveTextContent(
      /db-servers stop receiving this key.*web-servers receive it/);
    expect(screen.getByTestId("tag-changes")).toHaveTextContent("changes host-group from db-servers to web-servers");
    await userEvent.click(screen.getByTestId("save-key-details"));
    await waitFor(() => expect(api.calls("PATCH /api/v1/keys/:ref")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/keys/:ref")[0].body).toEqual({ tags: { env: "prod", "host-group": "web-servers" } });
  });

  it("shows the server's refusal and keeps the form", async () => {
    server(() => problem(422, "invalid_input", "at most 50 tags per key"));
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await open();
    await userEvent.type(screen.getByLabelText("Description"), " (PCI)");
    await userEvent.click(screen.getByTestId("save-key-details"));
    expect(await screen.findByText("at most 50 tags per key")).toBeInTheDocument();
    expect(screen.getByRole("form", { name: "Edit key details" })).toBeInTheDocument();
  });

  it("is not offered to a role that cannot update keys", async () => {
    server();
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("auditor") });
    await screen.findByTestId("key-name");
    const edit = screen.queryByTestId("edit-key");
    expect(edit === null || (edit as HTMLButtonElement).disabled).toBe(true);
  });
});

describe("tagChanges", () => {
  it("reads as adds, changes and removes", () => {
    expect(tagChanges({ a: "1", b: "2" }, { a: "1", b: "3", c: "" })).toEqual(["changes b from 2 to 3", "adds c"]);
    expect(tagChanges({ a: "1" }, {})).toEqual(["removes a"]);
  });
});

describe("Revoking a key that databases read", () => {
  const consumers = (items: object[]) => fakeApi({
    "GET /api/v1/keys/:ref": key,
    "GET /api/v1/keys/:ref/consumers": { items },
    "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null },
  });

  it("names them and says to stop them first: a running MariaDB aborts at its next write", async () => {
    consumers([{ kind: "database", name: "payments-db-01", detail: "key id 1", last_used_at: null },
               { kind: "kmip-client", name: "backup-01", detail: "3 operations", last_used_at: null }]);
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("revoke-key"));
    const warning = await screen.findByTestId("revoke-databases-warning");
    expect(warning).toHaveTextContent("A database reads this key");
    expect(warning).toHaveTextContent("payments-db-01");
    expect(warning).not.toHaveTextContent("backup-01");
    expect(warning).toHaveTextContent(/aborts at its next write.*Shut that database down cleanly first/);
  });

  it("counts a database that reads the key under two key ids once", async () => {
    consumers([{ kind: "database", name: "payments-db-01", detail: "key id 1", last_used_at: null },
               { kind: "database", name: "payments-db-01", detail: "key id 2", last_used_at: null }]);
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("revoke-key"));
    const warning = await screen.findByTestId("revoke-databases-warning");
    expect(warning).toHaveTextContent("A database reads this key");
    expect(warning.textContent?.match(/payments-db-01/g)).toHaveLength(1);
    expect(warning).toHaveTextContent("Shut that database down cleanly first");
  });

  it("says nothing of databases when none reads the key", async () => {
    consumers([{ kind: "kmip-client", name: "backup-01", detail: "3 operations", last_used_at: null }]);
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("revoke-key"));
    await screen.findByRole("dialog", { name: "Revoke payments-db" });
    expect(await screen.findByText("backup-01")).toBeInTheDocument(); // the Used by panel has loaded
    expect(screen.queryByTestId("revoke-databases-warning")).toBeNull();
  });
});
