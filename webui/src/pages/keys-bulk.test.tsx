import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { KeysPage } from "./Keys";

const key = (name: string, over: Partial<Key> = {}): Key => ({
  id: `id-${name}`, name, description: "", owner: "admin", tags: {}, algorithm: "AES", length_bits: 256, state: "active",
  current_version: 1, created_at: "2026-11-01T00:00:00Z", updated_at: "2026-11-01T00:00:00Z", rotation_period_days: null,
  next_rotation_at: null, exportable: true, kmip_group: null, versions: [], ...over,
});
const KEYS = [key("alpha"), key("bravo"), key("charlie")];

describe("Keys: server-side sorting", () => {
  it("asks the server to sort by the clicked column, then the other way, and says so to screen readers", async () => {
    const api = fakeApi({ "GET /api/v1/keys": { items: KEYS, total: 3, limit: 25, offset: 0 } });
    renderWith(<KeysPage />, { me: meAs("auditor"), at: "/keys", path: "/keys" });
    await screen.findByTestId("keys-table");
    expect(api.calls("GET /api/v1/keys")[0].url.searchParams.get("sort")).toBe("name");
    expect(screen.getByRole("columnheader", { name: /Name/ })).toHaveAttribute("aria-sort", "ascending");
    await userEvent.click(screen.getByRole("button", { name: "Sort by rotation" }));
    await waitFor(() => expect(api.calls("GET /api/v1/keys").at(-1)?.url.searchParams.get("sort")).toBe("next_rotation_at"));
    await userEvent.click(screen.getByRole("button", { name: "Sort by rotation" }));
    await waitFor(() => expect(api.calls("GET /api/v1/keys").at(-1)?.url.searchParams.get("sort")).toBe("-next_rotation_at"));
    expect(screen.getByRole("columnheader", { name: /Rotation/ })).toHaveAttribute("aria-sort", "descending");
  });
});

describe("Keys: bulk actions", () => {
  it("rotates the selected keys after one typed confirmation, one request each, and lists what was refused", async () => {
    const api = fakeApi({
      "GET /api/v1/keys": { items: KEYS, total: 3, limit: 25, offset: 0 },
      "POST /api/v1/keys/:ref/rotate": ({ params }) => params.ref === "id-bravo"
        ? problem(409, "key_destroyed", "bravo is destroyed: it cannot be rotated") : key(params.ref.slice(3), { current_version: 2 }),
    });
    renderWith(<KeysPage />, { me: meAs("admin"), at: "/keys", path: "/keys" });
    await userEvent.click(await screen.findByRole("checkbox", { name: "Select alpha" }));
    await userEvent.click(screen.getByRole("checkbox", { name: "Select bravo" }));
    expect(within(screen.getByTestId("bulk-bar")).getByText("2 keys selected")).toBeInTheDocument();
    await userEvent.click(screen.getByTestId("bulk-rotate"));
    const submit = await screen.findByTestId("bulk-confirm-submit");
    expect(submit).toBeDisabled();
    expect(api.calls("POST /api/v1/keys/:ref/rotate")).toHaveLength(0);
    await userEvent.type(screen.getByTestId("bulk-confirm-input"), "rotate 2 keys");
    await userEvent.click(submit);
    await screen.findByText("2 of 2 done");
    expect(api.calls("POST /api/v1/keys/:ref/rotate").map((c) => c.params.ref)).toEqual(["id-alpha", "id-bravo"]);
    expect(within(screen.getByTestId("bulk-failures")).getByText(/bravo is destroyed/)).toBeInTheDocument();
    await userEvent.click(screen.getByTestId("bulk-done"));
    await waitFor(() => expect(screen.queryByTestId("bulk-bar")).toBeNull());
  });

  it("revokes with the chosen reason; selecting the page selects every key on it", async () => {
    const api = fakeApi({
      "GET /api/v1/keys": { items: KEYS, total: 3, limit: 25, offset: 0 },
      "POST /api/v1/keys/:ref/revoke": ({ params }) => key(params.ref.slice(3), { state: "deactivated" }),
    });
    renderWith(<KeysPage />, { me: meAs("admin"), at: "/keys", path: "/keys" });
    await userEvent.click(await screen.findByRole("checkbox", { name: "Select every key on this page" }));
    await userEvent.click(screen.getByTestId("bulk-revoke"));
    await userEvent.type(await screen.findByTestId("bulk-confirm-input"), "revoke 3 keys");
    await userEvent.click(screen.getByTestId("bulk-confirm-submit"));
    await screen.findByText("3 of 3 done");
    const calls = api.calls("POST /api/v1/keys/:ref/revoke");
    expect(calls).toHaveLength(3);
    expect(calls[0].body).toEqual({ reason: "superseded" });
  });

  it("an auditor gets no selection boxes", async () => {
    fakeApi({ "GET /api/v1/keys": { items: KEYS, total: 3, limit: 25, offset: 0 } });
    renderWith(<KeysPage />, { me: meAs("auditor"), at: "/keys", path: "/keys" });
    await screen.findByTestId("keys-table");
    expect(screen.queryByRole("checkbox")).toBeNull();
  });
});
