import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { notifications } from "@mantine/notifications";
import { describe, expect, it, vi } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import type { Holder, Inventory, Retirement } from "../retirement";
import { holdersOf, progressOf } from "../retirement";
import { KeyDetailPage } from "./KeyDetail";

const key: Key = {
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments", description: "", owner: "admin", tags: {},
  algorithm: "AES", length_bits: 256, state: "active", current_version: 2, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null,
  versions: [1, 2].map((v) => ({
    version: v, state: v === 2 ? "active" as const : "deactivated" as const, created_at: "2026-11-22T00:00:00Z",
    activation_date: "2026-11-22T00:00:00Z", deactivation_date: v === 1 ? "2026-11-22T00:01:00Z" : null,
    compromise_date: null, destroy_date: null, revocation_reason: null, revocation_message: null,
    wrapping_key_id: "kek-1", wrapping_mechanism: "RSA-OAEP-SHA1", replaces: v === 2 ? 1 : null, replaced_by: v === 1 ? 2 : null,
  })),
};

const gp: Holder = { kind: "guard_point", holder: "gp-1@host-a", name: "/srv/data on host-a", host: "host-a", count: 5400,
                     state: "in_use", reported_at: "2026-11-26T19:00:00Z" };
const apps: Holder = { kind: "data_keys", holder: "applications", name: "applications", host: null, count: 120,
                       state: "in_use", reported_at: null };
const kmip: Holder = { kind: "kmip_client", holder: "backup-01", name: "backup-01", host: null, count: null,
                       state: "in_use", reported_at: null };
const hostB: Holder = { kind: "guard_point", holder: "gp-2@host-b", name: "/srv/logs on host-b", host: "host-b", count: null,
                        state: "unreported", reported_at: null };

const running: Retirement = {
  id: "r-1", key_id: key.id, key: "payments", version: 1, cancelled_at: null, cancelled_by: null, exclusions: [], state: "running", reason: "ISO 27001 A.8.24 annual retirement", contents: false, requested_by: "alice",
  requested_at: "2026-11-26T18:00:00Z", completed_at: null, statement_seq: null,
  initial: { data_keys: 200, guard_point_files: 10000, volumes: 0, databases: 0, xks_stores: 0, kmip_clients: 1 },
};

function inventory(over: Partial<Inventory> = {}): Inventory {
  return {
    key: "payments", key_id: key.id, version: 1, state: "deactivated", in_use: true, computed_at: "2026-11-26T19:30:00Z",
    kinds: { data_keys: 120, guard_point_files: 5400, volumes: 0, databases: 0, xks_stores: 0, kmip_clients: 1 },
    holders: [apps, gp, kmip], unreported_hosts: [], retirement: null, ...over,
  };
}

/** What every test starts from: the key's page, signed in as `role`, on a server answering
 *  the inventory of v1 with `inv` (or what `inv` returns, each time), and `more` besides. */
function setup(inv: Inventory | (() => Inventory | Response), more: Record<string, Parameters<typeof fakeApi>[0][string]> = {},
               role: Parameters<typeof meAs>[0] = "admin") {
  const api = fakeApi({
    "GET /api/v1/keys/:ref": key,
    "GET /api/v1/keys/:ref/consumers": { items: [] },
    "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null },
    "GET /api/v1/keys/:ref/versions/:version/inventory": typeof inv === "function" ? inv : () => inv,
    "GET /api/v1/retirements": [],
    ...more,
  });
  renderWith(<KeyDetailPage />, { at: "/keys/payments", path: "/keys/:keyRef", me: meAs(role) });
  return api;
}

async function openInventory() {
  await userEvent.click(await screen.findByRole("button", { name: "Inventory of v1" }));
  return screen.findByRole("dialog", { name: "Inventory of payments v1" });
}

async function openRetire() {
  await userEvent.click(await screen.findByRole("button", { name: "Retire v1…" }));
  return screen.findByRole("dialog", { name: "Retire payments v1" });
}

async function openDestroy() {
  await userEvent.click(await screen.findByTestId("destroy-key"));
  return screen.findByRole("dialog", { name: "Destroy payments" });
}

/** A reason or a key's name, pasted as a person would type it (a render per key is slow). */
async function typeInto(field: HTMLElement, text: string) {
  await userEvent.click(field);
  await userEvent.paste(text);
}

describe("The Versions panel", () => {
  it("offers the inventory and retirement for an older version only", async () => {
    setup(inventory());
    await screen.findByRole("button", { name: "Inventory of v1" });
    expect(screen.getByRole("button", { name: "Retire v1…" })).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: "Inventory of v2" })).toBeNull();
    expect(screen.queryByRole("button", { name: "Retire v2…" })).toBeNull();
  });

  it("lets an auditor read the inventory but not retire", async () => {
    setup(inventory(), {}, "auditor");
    await screen.findByRole("button", { name: "Inventory of v1" });
    expect(screen.queryByRole("button", { name: "Retire v1…" })).toBeNull();
    const drawer = await openInventory();
    await within(drawer).findByTestId("inventory-holders");
    expect(within(drawer).queryByTestId("inventory-retire")).toBeNull();
  });
});

describe("The Versions panel's retirement states", () => {
  it("a retiring version says so and is not offered another retirement; a retired one says retired", async () => {
    const three = { ...key, current_version: 3, versions: [...key.versions.map((v) => ({ ...v, state: "deactivated" as const })),
      { ...key.versions[1], version: 3, state: "active" as const }] };
    setup(inventory(), {
      "GET /api/v1/keys/:ref": three,
      "GET /api/v1/retirements": [
        { ...running, version: 1, state: "cancelled", requested_at: "2026-11-20T00:00:00Z" },
        { ...running, version: 1, id: "r-2", state: "complete", statement_seq: 81234, requested_at: "2026-11-25T00:00:00Z" },
        { ...running, version: 2, id: "r-3" },
        { ...running, key_id: "another-key", version: 2, id: "r-4", state: "complete" },
      ],
    });
    expect(await screen.findByTestId("retirement-v1")).toHaveTextContent("retired");
    expect(screen.getByTestId("retirement-v2")).toHaveTextContent("retiring");
    expect(screen.queryByRole("button", { name: "Retire v1…" })).toBeNull();
    expect(screen.queryByRole("button", { name: "Retire v2…" })).toBeNull();
    expect(screen.getByRole("button", { name: "Inventory of v2" })).toBeInTheDocument();
  });
});

describe("The inventory of a version", () => {
  it("in use: counts per kind, each holder with its state, and the way to retire", async () => {
    setup(inventory());
    const drawer = await openInventory();
    expect(await within(drawer).findByTestId("inventory-summary")).toHaveTextContent("v1 is in use");
    expect(within(drawer).getByTestId("inventory-summary")).toHaveTextContent(/Retire it to move every holder/);
    const kinds = within(drawer).getByTestId("inventory-kinds");
    expect(within(kinds).getByText("Guard-point files").parentElement).toHaveTextContent("5,400");
    expect(within(kinds).getByText("Data keys").parentElement).toHaveTextContent("120");
    const rows = within(drawer).getByTestId("inventory-holders").querySelectorAll("tbody tr");
    expect([...rows].map((r) => r.getAttribute("data-state"))).toEqual(["in_use", "in_use", "in_use"]);
    const gpRow = within(drawer).getByTestId("inventory-holders").querySelector('tr[data-holder="gp-1@host-a"]') as HTMLElement;
    expect(gpRow).toHaveTextContent("/srv/data on host-a");
    expect(gpRow).toHaveTextContent("on host-a");
    expect(gpRow).toHaveTextContent("5,400");
    expect(gpRow).toHaveTextContent("in use");
    // A KMIP client's count is unknown: the server cannot reach into it.
    expect(within(drawer).getByTestId("inventory-holders").querySelector('tr[data-holder="backup-01"]')).toHaveTextContent("unknown");
    expect(within(drawer).getByTestId("retirement")).toHaveTextContent("Not retired");
    // Not running: nothing to exclude from yet.
    expect(within(drawer).queryByRole("button", { name: /^Exclude/ })).toBeNull();
  });

  it("clear: says nothing uses it", async () => {
    setup(inventory({ in_use: false, kinds: { data_keys: 0, guard_point_files: 0 },
                      holders: [{ ...apps, count: 0, state: "clear" }] }));
    const drawer = await openInventory();
    expect(await within(drawer).findByTestId("inventory-summary")).toHaveTextContent("Nothing uses v1");
    expect(within(drawer).getByTestId("inventory-holders").querySelector("tbody tr")).toHaveAttribute("data-state", "clear");
  });

  it("unreported: names the hosts, says how to unblock the retirement, and excludes a decommissioned one", async () => {
    const api = setup(inventory({ holders: [apps, hostB], unreported_hosts: ["host-b"], retirement: running }), {
      "POST /api/v1/keys/:ref/versions/:version/retire/exclusions": () => json(201, running),
    });
    const drawer = await openInventory();
    const unreported = await within(drawer).findByTestId("unreported-hosts");
    expect(unreported).toHaveTextContent("host-b");
    expect(unreported).toHaveTextContent(/Bring it online.*or exclude a decommissioned host/);
    expect(within(drawer).getByTestId("inventory-holders").querySelector('tr[data-holder="gp-2@host-b"]'))
      .toHaveAttribute("data-state", "unreported");
    await userEvent.click(within(unreported).getByRole("button", { name: "Exclude host host-b…" }));
    const form = within(drawer).getByRole("form", { name: "Exclude host-b" });
    expect(form).toHaveTextContent("every guard point and volume of the host");
    await typeInto(within(form).getByTestId("exclude-reason"), "decommissioned, disks wiped (CHG-1234)");
    await userEvent.click(within(form).getByTestId("exclude-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/keys/:ref/versions/:version/retire/exclusions")).toHaveLength(1));
    expect(api.calls("POST /api/v1/keys/:ref/versions/:version/retire/exclusions")[0].body)
      .toEqual({ kind: "host", holder: "host-b", reason: "decommissioned, disks wiped (CHG-1234)" });
  });

  it("an auditor is offered no exclusion", async () => {
    setup(inventory({ holders: [apps, hostB], unreported_hosts: ["host-b"], retirement: running }), {}, "auditor");
    const drawer = await openInventory();
    await within(drawer).findByTestId("unreported-hosts");
    expect(within(drawer).queryByRole("button", { name: /^Exclude/ })).toBeNull();
    expect(within(drawer).queryByTestId("cancel-retirement")).toBeNull();
  });

  it("running: shows progress per kind, and excludes a holder with a reason", async () => {
    let inv = inventory({ holders: [apps, gp, { ...kmip }], retirement: running });
    const api = setup(() => inv, {
      "POST /api/v1/keys/:ref/versions/:version/retire/exclusions": ({ body }) => {
        inv = inventory({ holders: [apps, gp, { ...kmip, state: "excluded" }], retirement: running });
        return { ...(body as object) };
      },
    });
    const drawer = await openInventory();
    const retirement = await within(drawer).findByTestId("retirement");
    expect(retirement).toHaveAttribute("data-state", "running");
    expect(retirement).toHaveTextContent("ISO 27001 A.8.24 annual retirement");
    expect(within(drawer).getByTestId("retirement-progress")).toHaveTextContent(
      "Data keys: 120 of 200 left · Guard-point files: 5,400 of 10,000 left · KMIP clients: 1 of 1 left");
    expect(within(drawer).getByRole("progressbar", { name: "Moved to the newest version" })).toHaveAttribute("aria-valuenow", "46");

    await userEvent.click(within(drawer).getByRole("button", { name: "Exclude backup-01…" }));
    const form = within(drawer).getByRole("form", { name: "Exclude backup-01" });
    expect(within(form).getByTestId("exclude-submit")).toBeDisabled(); // a reason is required
    await typeInto(within(form).getByTestId("exclude-reason"), "client decommissioned 2026-11-01, its store wiped");
    await userEvent.click(within(form).getByTestId("exclude-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/keys/:ref/versions/:version/retire/exclusions")).toHaveLength(1));
    const call = api.calls("POST /api/v1/keys/:ref/versions/:version/retire/exclusions")[0];
    expect(call.params).toEqual({ ref: key.id, version: "1" });
    expect(call.body).toEqual({ kind: "kmip_client", holder: "backup-01", reason: "client decommissioned 2026-11-01, its store wiped" });
    // Excluded: its badge says so, and it is offered for exclusion no more.
    await waitFor(() => expect(within(drawer).getByTestId("inventory-holders").querySelector('tr[data-holder="backup-01"]'))
      .toHaveAttribute("data-state", "excluded"));
    expect(within(drawer).getByTestId("inventory-holders").querySelector('tr[data-holder="backup-01"]')).toHaveTextContent("excluded");
    expect(within(drawer).queryByRole("button", { name: "Exclude backup-01…" })).toBeNull();
  });

  it("an exclusion held for a second person says so", async () => {
    setup(inventory({ retirement: running }), {
      "POST /api/v1/keys/:ref/versions/:version/retire/exclusions": () => json(202, {
        status: "pending", code: "approval_required", detail: "Held for a second approver (key.retire_exclude)." }),
    });
    const drawer = await openInventory();
    await userEvent.click(await within(drawer).findByRole("button", { name: "Exclude applications…" }));
    await typeInto(within(drawer).getByTestId("exclude-reason"), "the batch job discards its blobs");
    await userEvent.click(within(drawer).getByTestId("exclude-submit"));
    expect(await within(drawer).findByTestId("exclude-held")).toHaveTextContent(/Held for a second approver.*until another person approves/);
  });

  it("cancels a running retirement after asking", async () => {
    let inv = inventory({ retirement: running });
    const api = setup(() => inv, {
      "DELETE /api/v1/keys/:ref/versions/:version/retire": () => {
        inv = inventory({ retirement: { ...running, state: "cancelled", cancelled_by: "alice", cancelled_at: "2026-11-26T19:40:00Z" } });
        return json(200, inv.retirement);
      },
    });
    const drawer = await openInventory();
    await userEvent.click(await within(drawer).findByTestId("cancel-retirement"));
    expect(within(drawer).getByText(/Nothing is undone/)).toBeInTheDocument();
    await userEvent.click(within(drawer).getByTestId("cancel-retirement-confirm"));
    await waitFor(() => expect(api.calls("DELETE /api/v1/keys/:ref/versions/:version/retire")).toHaveLength(1));
    await waitFor(() => expect(within(drawer).getByTestId("retirement")).toHaveAttribute("data-state", "cancelled"));
    expect(within(drawer).getByTestId("retirement")).toHaveTextContent("Cancelled by alice");
  });

  it("complete: links the signed statement's audit record", async () => {
    setup(inventory({ in_use: false, kinds: { data_keys: 0, guard_point_files: 0, kmip_clients: 0 },
                      holders: [{ ...apps, count: 0, state: "clear" }, { ...kmip, state: "excluded" }],
                      retirement: { ...running, state: "complete", completed_at: "2026-11-26T19:20:00Z", statement_seq: 81234 } }));
    const drawer = await openInventory();
    const statement = await within(drawer).findByTestId("retirement-statement");
    expect(statement).toHaveTextContent(/signed in the HSM.*can now be destroyed/);
    expect(within(statement).getByRole("link", { name: "#81234" })).toHaveAttribute("href", "/audit?seq=81234");
    expect(within(drawer).getByTestId("inventory-summary")).toHaveTextContent("Its retirement is complete");
    expect(within(drawer).queryByTestId("cancel-retirement")).toBeNull();
  });

  it("shows files no version of the key reads, per guard point, as blocking nothing", async () => {
    const clearGp = { ...gp, count: 0, state: "clear" as const, unreadable: 3 };
    setup(inventory({ in_use: false, kinds: { data_keys: 0, guard_point_files: 0 },
                      holders: [{ ...apps, count: 0, state: "clear" }, clearGp,
                                { ...hostB, count: 0, state: "clear", unreadable: 0 }],
                      retirement: { ...running, state: "complete", completed_at: "2026-11-26T19:20:00Z", statement_seq: 81234 } }));
    const drawer = await openInventory();
    const alert = await within(drawer).findByTestId("unreadable-files");
    expect(alert).toHaveTextContent("3 files with no readable header of this key");
    expect(alert).toHaveTextContent(/do not block its retirement\. The signed statement names each guard point and host/);
    expect(within(alert).getAllByRole("listitem").map((li) => li.textContent)).toEqual(["/srv/data on host-a: 3"]);
    const holders = within(drawer).getByTestId("inventory-holders");
    expect(holders.querySelector('tr[data-holder="gp-1@host-a"]')).toHaveTextContent("3 unreadable (no version of this key)");
    expect(within(holders).getAllByTestId("holder-unreadable")).toHaveLength(1);  // 0 and null say nothing
    expect(within(drawer).getByTestId("inventory-summary")).toHaveTextContent("Nothing uses v1");
  });

  it("says nothing of unreadable files when no walk found any", async () => {
    setup(inventory({ holders: [apps, { ...gp, unreadable: 0 }, kmip] }));
    const drawer = await openInventory();
    await within(drawer).findByTestId("inventory-holders");
    expect(within(drawer).queryByTestId("unreadable-files")).toBeNull();
  });

  it("when it cannot be computed, says so and what to do", async () => {
    setup(() => problem(404, "version_not_found", "payments has no version 1"));
    const drawer = await openInventory();
    const err = await within(drawer).findByTestId("api-error");
    expect(err).toHaveTextContent("The inventory could not be computed");
    expect(err).toHaveTextContent("payments has no version 1");
    expect(err).toHaveTextContent("go back to the list and open it again");
  });
});

describe("Retiring a version", () => {
  it("sends the reason and the contents choice, then shows the running retirement", async () => {
    let inv = inventory();
    const api = setup(() => inv, {
      "POST /api/v1/keys/:ref/versions/:version/retire": () => {
        inv = inventory({ retirement: { ...running, contents: true } });
        return json(201, inv.retirement);
      },
    });
    const dialog = await openRetire();
    expect(within(dialog).getByTestId("retire-submit")).toBeDisabled(); // a reason is required
    await typeInto(within(dialog).getByTestId("retire-reason"), "annual key retirement");
    await userEvent.click(within(dialog).getByLabelText("Also re-encrypt file contents"));
    await userEvent.click(within(dialog).getByTestId("retire-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/keys/:ref/versions/:version/retire")).toHaveLength(1));
    expect(api.calls("POST /api/v1/keys/:ref/versions/:version/retire")[0].body).toEqual({ reason: "annual key retirement", contents: true });
    // The inventory opens on the retirement just begun.
    const drawer = await screen.findByRole("dialog", { name: "Inventory of payments v1" });
    await waitFor(() => expect(within(drawer).getByTestId("retirement")).toHaveAttribute("data-state", "running"));
    expect(within(drawer).getByTestId("retirement")).toHaveTextContent("file contents re-encrypted too");
  });

  it("held for a second approver: says so, as other held actions do", async () => {
    setup(inventory(), {
      "POST /api/v1/keys/:ref/versions/:version/retire": () => json(202, {
        status: "pending", code: "approval_required", detail: "Held for a second approver (key.retire)." }),
    });
    const dialog = await openRetire();
    await typeInto(within(dialog).getByTestId("retire-reason"), "annual key retirement");
    await userEvent.click(within(dialog).getByTestId("retire-submit"));
    const held = await within(dialog).findByTestId("retire-held");
    expect(held).toHaveTextContent(/Waiting for approval.*Held for a second approver.*until then nothing moves/);
    expect(within(held).getByRole("link", { name: "Open approvals" })).toHaveAttribute("href", "/approvals");
  });

  it("refused: the server's reason and what to do next", async () => {
    setup(inventory(), {
      "POST /api/v1/keys/:ref/versions/:version/retire": () =>
        problem(409, "retirement_running", "a retirement of payments v1 is already running"),
    });
    const dialog = await openRetire();
    await typeInto(within(dialog).getByTestId("retire-reason"), "again");
    await userEvent.click(within(dialog).getByTestId("retire-submit"));
    const err = await within(dialog).findByTestId("api-error");
    expect(err).toHaveTextContent("Not retired");
    expect(err).toHaveTextContent("already running");
    expect(err).toHaveTextContent("open the version's inventory to follow or cancel it");
  });
});

describe("Destroying a version", () => {
  const inUse = () => new Response(JSON.stringify({
    type: "https://strongroom.dev/problems/version_in_use", title: "version_in_use", status: 409, code: "version_in_use",
    detail: "payments v1 is in use: 2 holders", request_id: "req-test", errors: [gp, apps],
  }), { status: 409, headers: { "content-type": "application/problem+json" } });

  it("picks a version, and on version_in_use shows the holders and the way forward", async () => {
    const api = setup(inventory(), { "POST /api/v1/keys/:ref/destroy": inUse });
    const dialog = await openDestroy();
    // v2 is active: the dialog starts on the older version, which the server would take.
    expect(within(dialog).getByTestId("destroy-version")).toHaveValue("v1 (deactivated)");
    await typeInto(within(dialog).getByTestId("typed-confirm-input"), "payments");
    await userEvent.click(within(dialog).getByRole("button", { name: "Destroy v1" }));
    const refused = await within(dialog).findByTestId("destroy-in-use");
    expect(api.calls("POST /api/v1/keys/:ref/destroy")[0].body).toEqual({ version: 1 });
    expect(within(refused).getByTestId("destroy-holders")).toHaveTextContent("Guard point /srv/data on host-a on host-a: 5,400");
    expect(within(refused).getByTestId("destroy-holders")).toHaveTextContent("Data keys applications: 120");
    expect(refused).toHaveTextContent(/Retire v1 first.*then destroy.*Or shred/);

    // Retire first: the retirement dialog opens on v1.
    await userEvent.click(within(refused).getByTestId("destroy-retire-v1"));
    expect(await screen.findByRole("dialog", { name: "Retire payments v1" })).toBeInTheDocument();
  });

  it("shreds anyway only after the key's name is typed again", async () => {
    let n = 0;
    const api = setup(inventory(), {
      "POST /api/v1/keys/:ref/destroy": () => (n++ === 0 ? inUse() : {
        ...key, versions: key.versions.map((v) => (v.version === 1 ? { ...v, state: "destroyed", destroy_date: "2026-11-26T19:45:00Z" } : v)),
      }),
    });
    const dialog = await openDestroy();
    await typeInto(within(dialog).getByTestId("typed-confirm-input"), "payments");
    await userEvent.click(within(dialog).getByTestId("typed-confirm-submit"));
    await userEvent.click(await within(dialog).findByTestId("shred-anyway"));
    expect(within(dialog).getByTestId("shred-warning")).toHaveTextContent("unreadable, for good");
    const submit = within(dialog).getByRole("button", { name: "Shred v1 anyway" });
    expect(within(dialog).getByTestId("typed-confirm-input")).toHaveValue("");
    expect(submit).toBeDisabled();
    await typeInto(within(dialog).getByTestId("typed-confirm-input"), "payments");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/keys/:ref/destroy")).toHaveLength(2));
    expect(api.calls("POST /api/v1/keys/:ref/destroy")[1].body).toEqual({ version: 1, shred: true });
    await waitFor(() => expect(screen.queryByRole("dialog", { name: "Destroy payments" })).toBeNull());
  });

  it("every version refused: names each holder's version and how to clear each", async () => {
    const off = { ...key, state: "deactivated" as const, versions: key.versions.map((v) => ({ ...v, state: "deactivated" as const })) };
    const api = setup(inventory(), {
      "GET /api/v1/keys/:ref": off,
      "POST /api/v1/keys/:ref/destroy": () => new Response(JSON.stringify({
        title: "version_in_use", status: 409, code: "version_in_use", detail: "2 holder(s) still use key 'payments' (versions [1, 2])",
        errors: [{ ...gp, version: 1 }, { ...apps, version: 2 }] }), { status: 409, headers: { "content-type": "application/problem+json" } }),
    });
    const dialog = await openDestroy();
    expect(within(dialog).getByTestId("destroy-version")).toHaveValue("Every version (2)");
    await typeInto(within(dialog).getByTestId("typed-confirm-input"), "payments");
    await userEvent.click(within(dialog).getByRole("button", { name: "Destroy every version" }));
    const refused = await within(dialog).findByTestId("destroy-in-use");
    expect(api.calls("POST /api/v1/keys/:ref/destroy")[0].body).toEqual({});
    expect(within(refused).getByTestId("destroy-holders")).toHaveTextContent("v1 · Guard point /srv/data on host-a");
    expect(within(refused).getByTestId("destroy-holders")).toHaveTextContent("v2 · Data keys applications: 120");
    expect(refused).toHaveTextContent(/Retire v1 first.*Rotate the key, then retire v2 the same way/);
    expect(within(refused).getByTestId("destroy-retire-v1")).toBeInTheDocument();
    expect(within(refused).queryByTestId("destroy-retire-v2")).toBeNull();
  });

  it("a destroy held for approval is not taken for the key", async () => {
    setup(inventory(), {
      "POST /api/v1/keys/:ref/destroy": () => json(202, { status: "pending", code: "approval_required", detail: "Held for a second approver (key.destroy)." }),
    });
    const shown = vi.spyOn(notifications, "show");
    const dialog = await openDestroy();
    await typeInto(within(dialog).getByTestId("typed-confirm-input"), "payments");
    await userEvent.click(within(dialog).getByTestId("typed-confirm-submit"));
    await waitFor(() => expect(shown).toHaveBeenCalledWith(expect.objectContaining({
      title: "Waiting for approval", message: "Held for a second approver (key.destroy)." })));
    // The pending request is not taken for the key: the page still shows it, v1 not destroyed.
    expect(screen.getByTestId("key-name")).toHaveTextContent("payments");
    expect(screen.getByTestId("version-timeline").querySelector('[data-state="destroyed"]')).toBeNull();
  });

  it("every version of a key with an active one is blocked before asking the server", async () => {
    const api = setup(inventory());
    const dialog = await openDestroy();
    await userEvent.click(within(dialog).getByTestId("destroy-version"));
    await userEvent.click(await screen.findByRole("option", { name: "Every version (2)" }));
    expect(within(dialog).getByTestId("typed-confirm-blocked")).toHaveTextContent(/active version.*older version/);
    expect(api.calls("POST /api/v1/keys/:ref/destroy")).toHaveLength(0);
  });
});

describe("retirement helpers", () => {
  it("progress is the share of the starting counts that has moved", () => {
    expect(progressOf({ data_keys: 100, guard_point_files: 100 }, { data_keys: 50, guard_point_files: 0 })).toBe(75);
    expect(progressOf(null, {})).toBeNull();
    expect(progressOf({ data_keys: 0 }, { data_keys: 0 })).toBeNull();
  });

  it("a refusal's holders are read from its errors, ignoring anything else there", () => {
    // A refusal from a server before `unreadable` lacks it: read as not said.
    expect(holdersOf({ errors: [gp, { msg: "x", loc: ["body"] }, null] })).toEqual([{ ...gp, unreadable: null }]);
    expect(holdersOf({ errors: [{ ...gp, unreadable: 2 }] })[0].unreadable).toBe(2);
    expect(holdersOf({})).toEqual([]);
  });
});
