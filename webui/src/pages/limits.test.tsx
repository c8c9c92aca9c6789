import { fireEvent, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, json } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { charCount, tooLong } from "../textLimits";
import { KeyDetailPage } from "./KeyDetail";
import { KeysPage } from "./Keys";
import { KmipClientsPage } from "./Kmip";
import { TokensPage } from "./Tokens";
import { UsersPage } from "./Users";

// A paste lands whole (one change event, as a browser's paste does); what does not fit is
// refused under its field, with both numbers, and nothing is sent. A field with the
// browser's maxlength would cut a real paste where this one cannot: it has none.
const paste = (field: HTMLElement, text: string) => {
  expect(field).not.toHaveAttribute("maxlength");
  fireEvent.change(field, { target: { value: text } });
};

const key: Key = {
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-db", description: "", owner: "alice", tags: {},
  algorithm: "AES", length_bits: 256, state: "active", current_version: 1, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null,
  versions: [{
    version: 1, state: "active", created_at: "2026-11-22T00:00:00Z", activation_date: "2026-11-22T00:00:00Z",
    deactivation_date: null, compromise_date: null, destroy_date: null, revocation_reason: null, revocation_message: null,
    wrapping_key_id: "kek-1", wrapping_mechanism: "RSA-OAEP-SHA1", replaces: null, replaced_by: null,
  }],
};

/** A 422 as keyserver/api/problems.py words it for pydantic's max_length. */
const tooLongProblem = (field: string, max: number) => json(422, {
  type: "https://strongroom.dev/problems/validation_error", title: "validation_error", status: 422,
  code: "validation_error", detail: `${field}: String should have at most ${max} characters`, request_id: "req-1",
  errors: [{ loc: ["body", field], msg: `String should have at most ${max} characters`, type: "string_too_long" }],
});

describe("text limits: refused with a message, never cut", () => {
  it("counts characters as the server does and says both numbers", () => {
    expect(charCount("🔑".repeat(3))).toBe(3); // code points, as Python's len
    expect(tooLong("a".repeat(128), 128)).toBeNull();
    expect(tooLong("a".repeat(5000), 128)).toBe("At most 128 characters; this one has 5,000");
  });

  it("Create key: a 5,000-character name and a 200 KB description stay as pasted, refused under their fields", async () => {
    const api = fakeApi({ "GET /api/v1/keys": { items: [], total: 0, limit: 25, offset: 0 } });
    renderWith(<KeysPage />, { me: meAs("admin"), at: "/keys", path: "/keys" });
    await userEvent.click(await screen.findByTestId("create-key"));
    const dialog = await screen.findByRole("dialog", { name: "Create key" });
    const name = within(dialog).getByLabelText(/^Name/);
    paste(name, "n".repeat(5000));
    expect(name).toHaveValue("n".repeat(5000));
    expect(within(dialog).getByText("At most 128 characters; this one has 5,000")).toBeInTheDocument();
    expect(name).toHaveAttribute("aria-invalid", "true");
    expect(within(dialog).getByRole("button", { name: "Create key" })).toBeDisabled();
    paste(name, "payments-db");
    const description = within(dialog).getByLabelText("Description");
    paste(description, "d".repeat(200_000));
    expect((description as HTMLTextAreaElement).value).toHaveLength(200_000);
    expect(within(dialog).getByText("At most 2,000 characters; this one has 200,000")).toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create key" })).toBeDisabled();
    fireEvent.submit(within(dialog).getByRole("form", { name: "Create key" })); // Enter in a field: still nothing sent
    expect(api.calls("POST /api/v1/keys")).toHaveLength(0);
    paste(description, "Card vault");
    expect(within(dialog).queryByText(/^At most/)).not.toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create key" })).toBeEnabled();
  });

  it("Create key: the server's 422 shows as words under the field and in the alert, not pydantic's", async () => {
    fakeApi({
      "GET /api/v1/keys": { items: [], total: 0, limit: 25, offset: 0 },
      "POST /api/v1/keys": () => tooLongProblem("name", 128),
    });
    renderWith(<KeysPage />, { me: meAs("admin"), at: "/keys", path: "/keys" });
    await userEvent.click(await screen.findByTestId("create-key"));
    const dialog = await screen.findByRole("dialog", { name: "Create key" });
    paste(within(dialog).getByLabelText(/^Name/), "payments-db");
    await userEvent.click(within(dialog).getByRole("button", { name: "Create key" }));
    const alert = await within(dialog).findByRole("alert");
    expect(alert).toHaveTextContent("Name: At most 128 characters");
    expect(dialog).not.toHaveTextContent(/String should have/);
    expect(within(dialog).getByLabelText(/^Name/)).toHaveAccessibleDescription(/At most 128 characters/);
  });

  it("Edit key and Revoke: description, owner and message refused when too long", async () => {
    const api = fakeApi({
      "GET /api/v1/keys/:ref": key,
      "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null },
    });
    renderWith(<KeyDetailPage />, { at: "/keys/payments-db", path: "/keys/:keyRef", me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("edit-key"));
    let dialog = await screen.findByRole("dialog", { name: "Edit payments-db" });
    paste(within(dialog).getByLabelText("Description"), "d".repeat(2001));
    expect(within(dialog).getByText("At most 2,000 characters; this one has 2,001")).toBeInTheDocument();
    paste(within(dialog).getByLabelText("Owner"), "o".repeat(129));
    expect(within(dialog).getByText("At most 128 characters; this one has 129")).toBeInTheDocument();
    expect(within(dialog).getByTestId("save-key-details")).toBeDisabled();
    expect(api.calls("PATCH /api/v1/keys/:ref")).toHaveLength(0);
    await userEvent.click(within(dialog).getByRole("button", { name: "Cancel" }));
    await waitFor(() => expect(screen.queryByRole("dialog")).not.toBeInTheDocument());

    await userEvent.click(screen.getByTestId("revoke-key"));
    dialog = await screen.findByRole("dialog", { name: "Revoke payments-db" });
    paste(within(dialog).getByLabelText(/^Message/), "m".repeat(1500));
    expect(within(dialog).getByText("At most 1,000 characters; this one has 1,500")).toBeInTheDocument();
    paste(within(dialog).getByTestId("typed-confirm-input"), "payments-db");
    expect(within(dialog).getByTestId("typed-confirm-submit")).toBeDisabled();
    paste(within(dialog).getByLabelText(/^Message/), "rotated out");
    expect(within(dialog).getByTestId("typed-confirm-submit")).toBeEnabled();
  });

  it("Create user: a 65-character username and a 201-character full name refused; the server's 422 on a field too", async () => {
    const api = fakeApi({ "GET /api/v1/users": [], "POST /api/v1/users": () => tooLongProblem("full_name", 200) });
    renderWith(<UsersPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-user"));
    const dialog = await screen.findByRole("dialog", { name: "Create user" });
    const username = within(dialog).getByLabelText(/^Username/);
    paste(username, "u".repeat(65));
    expect(username).toHaveValue("u".repeat(65));
    expect(within(dialog).getByText("At most 64 characters; this one has 65")).toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create user" })).toBeDisabled();
    paste(username, "carol");
    paste(within(dialog).getByLabelText("Full name"), "f".repeat(201));
    expect(within(dialog).getByText("At most 200 characters; this one has 201")).toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create user" })).toBeDisabled();
    expect(api.calls("POST /api/v1/users")).toHaveLength(0);
    paste(within(dialog).getByLabelText("Full name"), "Carol");
    await userEvent.click(within(dialog).getByRole("button", { name: "Create user" }));
    expect(await within(dialog).findByRole("alert")).toHaveTextContent("Full name: At most 200 characters");
    expect(within(dialog).getByLabelText("Full name")).toHaveAccessibleDescription("At most 200 characters");
  });

  it("Create API token: a 101-character name refused", async () => {
    const api = fakeApi({ "GET /api/v1/tokens": [] });
    renderWith(<TokensPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-token"));
    const dialog = await screen.findByRole("dialog", { name: "Create API token" });
    paste(within(dialog).getByLabelText(/^Name/), "t".repeat(101));
    expect(within(dialog).getByText("At most 100 characters; this one has 101")).toBeInTheDocument();
    expect(within(dialog).getByRole("button", { name: "Create token" })).toBeDisabled();
    expect(api.calls("POST /api/v1/tokens")).toHaveLength(0);
  });

  it("Create KMIP client: a 65-character name refused by its length, not called a bad DNS name", async () => {
    fakeApi({ "GET /api/v1/kmip/clients": [] });
    renderWith(<KmipClientsPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("create-kmip-client"));
    const dialog = await screen.findByRole("dialog", { name: "Create KMIP client" });
    paste(within(dialog).getByLabelText(/^Name/), "a".repeat(65));
    expect(within(dialog).getByText("At most 64 characters; this one has 65")).toBeInTheDocument();
    expect(within(dialog).getByTestId("create-kmip-client-submit")).toBeDisabled();
  });
});
