import { screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Host, Key, Schemas } from "../api/client";
import { hostPage } from "../test/hostPage";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { AttentionPanel, AuditActivityPanel, BURST_MIN, attention } from "./DashboardActivity";

const NOW = Date.parse("2026-11-25T12:30:00Z");
const hourly = (denied: number[]): Schemas["AuditActivity"] => ({
  bucket: "hour",
  buckets: denied.map((d, i) => ({ start: new Date(NOW - (denied.length - 1 - i) * 3_600_000).toISOString().slice(0, 13) + ":00:00Z",
                                  allowed: 100, denied: d, error: 0 })),
  totals: { allowed: 100 * denied.length, denied: denied.reduce((a, b) => a + b, 0), error: 0 },
  top_refused_actors: [{ name: "svc-batch", count: 90 }], top_refused_actions: [{ name: "datakey.decrypt", count: 90 }],
  top_refusal_reasons: [{ name: "missing datakeys:decrypt", count: 90 }],
});
const host = (over: Partial<Host>): Host => ({
  id: "11111111-1111-4111-8111-111111111111", hostname: "db-01", host_group: "db", os: "Debian 13", agent_version: "0.4.0",
  cert_serial: "5A", state: "active", enrolled_at: "2026-11-01T00:00:00Z", last_heartbeat_at: "2026-11-25T12:29:50Z",
  revoked_at: null, last_seen_ip: null, online: true, guard_points: [], ...over,
});
const key = (over: Partial<Key>): Key => ({
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-db", description: "", owner: "admin", tags: {},
  algorithm: "AES", length_bits: 256, state: "active", current_version: 1, created_at: "2026-11-01T00:00:00Z",
  updated_at: "2026-11-01T00:00:00Z", rotation_period_days: 30, next_rotation_at: "2026-11-30T00:00:00Z",
  exportable: true, kmip_group: null, versions: [], ...over,
});

describe("attention: what the dashboard raises", () => {
  it("a burst of refusals this hour, against the usual rate, with the top actor and a filtered link", () => {
    const items = attention({ activity: hourly([2, 3, 1, 2, 90]) }, NOW);
    expect(items).toHaveLength(1);
    expect(items[0]).toMatchObject({ id: "denial-burst", level: "critical", title: "90 refusals this hour" });
    expect(items[0].detail).toContain("Usually about 2 an hour. Most from svc-batch.");
    expect(items[0].to).toBe("/audit?outcome=denied&since=2026-11-25T12%3A00");
  });

  it("requests waiting for this user's approval, linking to them", () => {
    const items = attention({ waiting: [{ action: "key.destroy", requested_by: "alice" }, { action: "kek.rotate", requested_by: "bob" }] }, NOW);
    expect(items).toEqual([{ id: "approvals-waiting", level: "warning", title: "2 requests wait for your approval",
                             detail: "key.destroy by alice, kek.rotate by bob", to: "/approvals" }]);
    expect(attention({ waiting: [] }, NOW)).toEqual([]);
  });

  it("no burst when the hour is ordinary or small", () => {
    expect(attention({ activity: hourly([40, 50, 45, 60, 55]) }, NOW)).toEqual([]); // busy, but usual
    expect(attention({ activity: hourly([0, 0, 0, 0, BURST_MIN - 1]) }, NOW)).toEqual([]); // too few to page anyone
  });

  it("offline hosts, guard points in error, overdue rotations and an unverified chain, most serious first", () => {
    const items = attention({
      hosts: [host({}), host({ id: "2", hostname: "db-02", online: false }),
              host({ id: "3", hostname: "db-03", guard_points: [{ path: "/srv", key: "k", state: "error", detail: "" }] }),
              host({ id: "4", hostname: "old", state: "revoked", online: false })],
      keys: [key({}), key({ name: "ledger", next_rotation_at: "2026-11-20T00:00:00Z" })],
      chain: { head_seq: 10, verified: null },
      health: { status: "unavailable", checks: [{ name: "hsm", ok: false, detail: "token not found", latency_ms: null }] } as Schemas["SystemHealth"],
    }, NOW);
    expect(items.map((i) => i.id)).toEqual(["check-hsm", "hosts-offline", "guard-point-errors", "rotations-overdue", "chain-unverified"]);
    expect(items[1]).toMatchObject({ title: "1 host is offline", detail: "db-02", to: "/hosts?status=offline" });
    expect(items[3]).toMatchObject({ title: "1 key rotation is overdue", to: "/keys/ledger" });
    expect(items[0]).toMatchObject({ title: "The HSM does not answer", detail: "token not found", to: "/system" });
  });
});

describe("dashboard panels", () => {
  it("shows activity by outcome with links to the refused records, and switches range", async () => {
    const api = fakeApi({ "GET /api/v1/audit/activity": ({ url }) => ({ ...hourly([1, 2, 3]), bucket: url.searchParams.get("bucket") }) });
    renderWith(<AuditActivityPanel />, { me: meAs("auditor") });
    const panel = await screen.findByTestId("audit-activity");
    expect(within(panel).getByText("svc-batch").closest("a")).toHaveAttribute("href", expect.stringContaining("actor=svc-batch"));
    expect(within(panel).getByRole("link", { name: /6 denied/ })).toBeInTheDocument();
    await userEvent.click(screen.getByText("30 days"));
    const calls = api.calls("GET /api/v1/audit/activity");
    expect(calls.at(-1)?.url.searchParams.get("bucket")).toBe("day");
    expect(calls[0].url.searchParams.get("bucket")).toBe("hour");
  });

  it("says so when nothing needs attention", async () => {
    fakeApi({
      "GET /api/v1/system/health": { status: "ok", checks: [{ name: "database", ok: true, detail: "ok", latency_ms: 1 }] },
      "GET /api/v1/hosts": ({ url }) => hostPage([host({})], url),
      "GET /api/v1/keys": { items: [key({})], total: 1, limit: 500, offset: 0 },
      "GET /api/v1/audit/activity": hourly([1, 1, 1]),
      "GET /api/v1/audit/status": { head_seq: 10, verified: { checkpoint: 1, seq: 10, at: "2026-11-25T12:00:00Z" },
                                    last_checkpoint: null, key_fingerprint: "ab" },
    });
    renderWith(<AttentionPanel />, { me: meAs("admin") });
    expect(await screen.findByTestId("attention-none")).toHaveTextContent("Nothing needs attention");
  });
});
