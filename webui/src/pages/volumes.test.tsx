import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../api/client";
import { fakeApi, json } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { VolumeDetailPage, VolumesPage, fmtBytes, graceLabel, rekeyStatus } from "./Volumes";

type Volume = Schemas["VolumePublic"];
const ID = "7a0c1e52-5d1e-4c55-9a58-3f3b1f0c2d11";
const volume = (over: Partial<Volume> = {}): Volume => ({
  id: ID, name: "pgdata", host_id: "h1", hostname: "db1.example.com", host_group: "db", scope: "host",
  path: "/dev/sdb", key_id: "k1", key_name: "db-volumes", key_version: 2, luks_uuid: "0f6e7c5e-2a55-4c3e-9d5c-9d1b8a1f0a11",
  size_bytes: 500 * 2 ** 30, sector_size: 4096, state: "open", opened_by: "userspace", rekey_generation: 0, rekey_applied: 0,
  rekey: null, has_recovery: true, grace_seconds: 0, recovery_created_at: "2026-11-20T10:00:00Z", revoked_at: null, created_by: "host:db1.example.com",
  created_at: "2026-11-01T10:00:00Z", updated_at: "2026-11-20T10:00:00Z", last_opened_at: "2026-11-24T08:00:00Z", ...over,
});

describe("volumes", () => {
  it("lists each volume with its host, device, key version, size and how it is open", async () => {
    fakeApi({ "GET /api/v1/volumes": [volume(), volume({ id: "2", name: "san", scope: "group", state: "revoked", opened_by: null })] });
    renderWith(<VolumesPage />, { me: meAs("auditor") });
    const table = await screen.findByTestId("volumes-table");
    const row = within(table).getByText("pgdata").closest("tr")!;
    expect(within(row).getByText("db1.example.com")).toHaveAttribute("href", "/hosts/h1");
    expect(within(row).getByText("v2")).toBeInTheDocument();
    expect(within(row).getByText("500 GiB")).toBeInTheDocument();
    expect(within(row).getByText("userspace")).toBeInTheDocument();
    const san = within(table).getByText("san").closest("tr")!;
    expect(within(san).getByText("revoked").closest("[data-state]")).toHaveAttribute("data-state", "revoked");
    expect(within(san).getByText("shared with group db")).toBeInTheDocument();
  });

  it("says how far a re-key is, and when one waits for its host", () => {
    expect(rekeyStatus(volume())).toBeNull();
    expect(rekeyStatus(volume({ rekey_generation: 1 }))?.label).toBe("re-key asked for: waiting for the host");
    expect(rekeyStatus(volume({ rekey_generation: 1, state: "rekeying",
                                rekey: { generation: 1, done: 25, total: 100, finished: false } }))).toEqual(
      { label: "re-encrypting: 25 %", percent: 25 });
    // Reported interrupted by its host (no longer "rekeying"): not a re-key under way.
    expect(rekeyStatus(volume({ rekey_generation: 1, state: "closed",
                                rekey: { generation: 1, done: 25, total: 100, finished: false } }))).toEqual(
      { label: "re-key interrupted at 25 %: resume it on the host with kms-agent volume rekey pgdata", percent: 25 });
    expect(rekeyStatus(volume({ rekey_generation: 1, rekey_applied: 1,
                                rekey: { generation: 1, done: 100, total: 100, finished: true } }))).toBeNull();
    expect(fmtBytes(1536)).toBe("1.5 KiB");
    expect(fmtBytes(null)).toBe("—");
  });

  it("reads an offline grace exactly", () => {
    expect(graceLabel(0)).toBe("none: fail closed");
    expect(graceLabel(20)).toBe("20 seconds");
    expect(graceLabel(1)).toBe("1 second");
    expect(graceLabel(90)).toBe("1 minute 30 seconds");
    expect(graceLabel(5400)).toBe("1 hour 30 minutes");
    expect(graceLabel(7200)).toBe("2 hours");
    expect(graceLabel(86_400 + 61)).toBe("1 day 1 minute 1 second");
    expect(graceLabel(604_800)).toBe("7 days");
  });

  it("revokes a volume only after its name is typed, then shows it revoked", async () => {
    let current = volume();
    const api = fakeApi({
      [`GET /api/v1/volumes/${ID}`]: () => json(200, current),
      "GET /api/v1/audit/events": { items: [], next_before_seq: null, total: 0, total_exact: true },
      [`POST /api/v1/volumes/${ID}/revoke`]: () => { current = volume({ state: "revoked", revoked_at: new Date().toISOString() }); return json(200, current); },
    });
    renderWith(<VolumeDetailPage />, { me: meAs("admin"), at: `/volumes/${ID}`, path: "/volumes/:volumeId" });
    await userEvent.click(await screen.findByTestId("volume-revoke"));
    const dialog = await screen.findByRole("dialog");
    const confirm = within(dialog).getByRole("button", { name: "Revoke volume" });
    expect(confirm).toBeDisabled();
    await userEvent.type(within(dialog).getByRole("textbox"), "pgdata");
    await userEvent.click(confirm);
    await waitFor(() => expect(api.calls(`POST /api/v1/volumes/${ID}/revoke`)).toHaveLength(1));
    expect(await screen.findByText(/The server refuses to unseal this volume/)).toBeInTheDocument();
    expect(screen.queryByTestId("volume-revoke")).toBeNull();
  });

  it("sets the offline grace, which the server records", async () => {
    let current = volume();
    const api = fakeApi({
      [`GET /api/v1/volumes/${ID}`]: () => json(200, current),
      "GET /api/v1/audit/events": { items: [], next_before_seq: null, total: 0, total_exact: true },
      [`PUT /api/v1/volumes/${ID}/policy`]: ({ body }) => {
        current = volume({ grace_seconds: (body as { grace_seconds: number }).grace_seconds });
        return json(200, current);
      },
    });
    renderWith(<VolumeDetailPage />, { me: meAs("admin"), at: `/volumes/${ID}`, path: "/volumes/:volumeId" });
    await userEvent.click(await screen.findByRole("textbox", { name: "Offline grace" }));
    await userEvent.click(await screen.findByRole("option", { name: "1 day", hidden: true }));
    await waitFor(() => expect(api.calls(`PUT /api/v1/volumes/${ID}/policy`)).toHaveLength(1));
    expect(api.calls(`PUT /api/v1/volumes/${ID}/policy`)[0].body).toEqual({ grace_seconds: 86_400 });
    await waitFor(() => expect(screen.getByRole("textbox", { name: "Offline grace" })).toHaveValue("1 day"));
  });

  it("offers no revoke or re-key to a role that cannot manage volumes", async () => {
    fakeApi({ [`GET /api/v1/volumes/${ID}`]: volume({ rekey_generation: 1, state: "rekeying",
                                                        rekey: { generation: 1, done: 50, total: 200, finished: false } }),
              "GET /api/v1/audit/events": { items: [], next_before_seq: null, total: 0, total_exact: true } });
    renderWith(<VolumeDetailPage />, { me: meAs("auditor"), at: `/volumes/${ID}`, path: "/volumes/:volumeId" });
    expect(await screen.findByTestId("volume-rekey-progress")).toHaveTextContent("re-encrypting: 25 %");
    expect(screen.queryByTestId("volume-revoke")).toBeNull();
    expect(screen.queryByTestId("volume-rekey")).toBeNull();
    expect(screen.getByText("none: fail closed")).toBeInTheDocument();
  });
});
