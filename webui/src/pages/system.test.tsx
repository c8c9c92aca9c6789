import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../api/client";
import { fakeApi, json, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { SystemPage, retireBlockedBy } from "./System";

type Status = Schemas["KekStatus"];
const HSM = { manufacturer: "SoftHSM project", model: "SoftHSM v2", firmware: "2.6", rsa_wrap_mechanism: "RSA-OAEP-SHA256" };
const kek = (id: string, state: Schemas["KekPublic"]["state"], wrapped: Record<string, number>) => ({
  kek_id: id, state, created_at: "2026-11-01T10:00:00Z", superseded_at: state === "active" ? null : "2026-11-20T10:00:00Z",
  retired_at: null, retired_by: null, wrapped, wrapped_versions: wrapped.key_versions ?? 0,
});
const rotation = (state: string, done: number) => ({
  id: "11111111-1111-4111-8111-111111111111", from_kek_id: "kek-1", to_kek_id: "kek-2", state,
  started_at: "2026-11-25T10:00:00Z", finished_at: state === "completed" ? "2026-11-25T10:01:00Z" : null,
  total: 10, done, error: null, requested_by: "admin",
  progress: { key_versions: { done: Math.min(done, 8), total: 8 }, ca: { done: Math.max(0, done - 8), total: 1 },
              totp_secrets: { done: 0, total: 1 } },
});

const health = (over: Partial<Schemas["SystemHealth"]> = {}): Schemas["SystemHealth"] => ({
  status: "ok", version: "0.2.0", hostname: "ks-1", pid: 4242, replica_id: "ks-1:4242:1", started_at: "2026-11-25T09:00:00Z", store: "postgresql",
  workers: 2, checks: [{ name: "database", ok: true, detail: "ok", latency_ms: 0.8 }, { name: "hsm", ok: true, detail: "ok", latency_ms: 1.2 }],
  audit_head_seq: 1234, audit_pending: 3, audit_last_checkpoint_at: "2026-11-25T09:59:00Z", audit_verified_seq: 1200,
  audit_fail_closed: false, sinks: [], active_kek: "kek-2", kek_rotation_running: false, replicas: [], ...over,
});
const replica = (id: string, version: string, live: boolean, scheduler_error: string | null = null) => ({
  id, hostname: id.split(":")[0], pid: Number(id.split(":")[1]), version, store: "postgresql", live,
  started_at: "2026-11-25T09:00:00Z", last_seen_at: "2026-11-25T10:00:00Z", scheduler_error,
});

describe("System page: health", () => {
  it("names the replica, times each check, and shows the chain's head and backlog", async () => {
    fakeApi({ "GET /api/v1/system/health": health(),
              "GET /api/v1/system/kek": { keks: [kek("kek-2", "active", {})], last_rotation: null, hsm: HSM } });
    renderWith(<SystemPage />, { me: meAs("auditor") });
    const section = await screen.findByTestId("system-health");
    expect(within(section).getByText("Healthy")).toBeInTheDocument();
    expect(within(section).getByText("0.8 ms")).toBeInTheDocument();
    expect(within(section).getByText(/Answered by ks-1 \(pid 4242, 2 workers\)/)).toBeInTheDocument();
    expect(within(section).getByText("record 1,234")).toBeInTheDocument();
    expect(within(section).getByText(/No audit sinks/)).toBeInTheDocument();
  });

  it("lists the replicas, live or gone, and warns while two versions run side by side", async () => {
    fakeApi({ "GET /api/v1/system/health": health({ replicas: [
                replica("ks-1:4242:1", "0.2.0", true),
                replica("ks-1:4242:0", "0.2.0", true), // another server in the same process (one pid)
                replica("ks-2:77:1", "0.1.0", true, "the HSM did not answer"),
                replica("ks-3:99:1", "0.2.0", false)] }),
              "GET /api/v1/system/kek": { keks: [kek("kek-2", "active", {})], last_rotation: null, hsm: HSM } });
    renderWith(<SystemPage />, { me: meAs("auditor") });
    const table = await screen.findByTestId("replicas");
    const state = (id: string) => table.querySelector(`[data-replica="${id}"]`)?.getAttribute("data-live");
    expect([state("ks-1:4242:1"), state("ks-2:77:1"), state("ks-3:99:1")]).toEqual(["true", "true", "false"]);
    // The one that answered, by its id: not every server that shares its process.
    expect(table.querySelector('[data-replica="ks-1:4242:1"]')).toHaveTextContent("answered this page");
    expect(within(table).getAllByText(/answered this page/)).toHaveLength(1);
    expect(screen.getByTestId("mixed-versions")).toHaveTextContent("2 versions running");
    expect(table.querySelector('[data-replica="ks-2:77:1"] [data-testid="replica-scheduler"]'))
      .toHaveTextContent("failing, retried each interval: the HSM did not answer");
  });

  it("shows a failing HSM with the server's advice, and a failing sink with its error", async () => {
    fakeApi({
      "GET /api/v1/system/health": health({
        status: "unavailable",
        checks: [{ name: "database", ok: true, detail: "ok", latency_ms: 0.8 },
                 { name: "hsm", ok: false, detail: "token 'strongroom' not found: run `keyserver init`", latency_ms: null },
                 { name: "audit_sinks", ok: false, detail: "failing: siem: connection refused", latency_ms: null }],
        sinks: [{ name: "siem", kind: "syslog", healthy: false, backlog: 420, delivered_seq: 814, delivered_at: null,
                  last_error: "connection refused" }],
      }),
      "GET /api/v1/system/kek": { keks: [kek("kek-2", "active", {})], last_rotation: null, hsm: HSM },
    });
    renderWith(<SystemPage />, { me: meAs("admin") });
    const section = await screen.findByTestId("system-health");
    expect(within(section).getByText("Not ready")).toBeInTheDocument();
    expect(within(section).getByText(/token 'strongroom' not found/)).toBeInTheDocument();
    const sinks = within(section).getByTestId("audit-sinks");
    expect(within(sinks).getByText("failing")).toBeInTheDocument();
    expect(within(sinks).getByText("420 records")).toBeInTheDocument();
  });
});

describe("KEK & HSM page", () => {
  it("shows a running rotation's progress per kind and follows it to the end", async () => {
    let polls = 0;
    const status = (): Status => {
      polls += 1;
      const done = polls === 1 ? 4 : 10;
      return {
        keks: [kek("kek-1", done === 10 ? "superseded" : "retiring", { key_versions: 10 - done }),
               kek("kek-2", "active", { key_versions: done })],
        last_rotation: rotation(done === 10 ? "completed" : "running", done), hsm: HSM,
      } as unknown as Status;
    };
    fakeApi({ "GET /api/v1/system/kek": status, "GET /api/v1/system/health": health() });
    renderWith(<SystemPage />, { me: meAs("admin") });
    const card = await screen.findByTestId("kek-rotation");
    expect(within(card).getByText("4 of 10 re-wrapped (40 %)")).toBeInTheDocument();
    expect(within(card).getByText("The internal CA's key")).toBeInTheDocument();
    expect(screen.getByTestId("rotate-kek")).toBeDisabled();
    // Polled while running; stops once completed.
    await waitFor(() => expect(within(screen.getByTestId("kek-rotation")).getByText("10 of 10 re-wrapped (100 %)"))
      .toBeInTheDocument(), { timeout: 3000 });
    expect(screen.getByTestId("rotate-kek")).toBeEnabled();
  });

  it("starts a rotation only after confirmation, and says when it waits for an approval", async () => {
    const api = fakeApi({
      "GET /api/v1/system/health": health(),
      "GET /api/v1/system/kek": { keks: [kek("kek-1", "active", { key_versions: 3 })], last_rotation: null, hsm: HSM },
      "POST /api/v1/system/kek/rotate": () => json(202, { status: "pending", code: "approval_required",
        detail: "KEK rotation waits for another administrator's approval (request 42)", approval: {} }),
    });
    renderWith(<SystemPage />, { me: meAs("admin") });
    await userEvent.click(await screen.findByTestId("rotate-kek"));
    expect(api.calls("POST /api/v1/system/kek/rotate")).toHaveLength(0);
    expect(await screen.findByText(/3 item\(s\) — is re-wrapped in the background/)).toBeInTheDocument();
    await userEvent.click(screen.getByTestId("rotate-kek-confirm"));
    await waitFor(() => expect(api.calls("POST /api/v1/system/kek/rotate")).toHaveLength(1));
  });

  it("retires a superseded KEK after its id is typed, and shows the server's list when it still wraps something", async () => {
    const api = fakeApi({
      "GET /api/v1/system/health": health(),
      "GET /api/v1/system/kek": { keks: [kek("kek-1", "superseded", {}), kek("kek-2", "active", { key_versions: 5 })],
                                  last_rotation: rotation("completed", 10), hsm: HSM },
      "POST /api/v1/system/keks/:id/retire": () => problem(409, "kek_in_use",
        "KEK kek-1 still wraps key versions: 1 (payments v3). Rotate the KEK again (`keyserver rotate-kek`) to re-wrap them, then retire this one"),
    });
    renderWith(<SystemPage />, { me: meAs("admin") });
    expect(screen.queryByRole("button", { name: "Retire KEK kek-2" })).toBeNull(); // the active one: no action
    await userEvent.click(await screen.findByRole("button", { name: "Retire KEK kek-1" }));
    const submit = await screen.findByTestId("typed-confirm-submit");
    expect(submit).toBeDisabled();
    await userEvent.type(screen.getByTestId("typed-confirm-input"), "kek-1");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("POST /api/v1/system/keks/:id/retire")).toHaveLength(1));
    expect(await screen.findByText(/still wraps key versions: 1 \(payments v3\)/)).toBeInTheDocument();
    expect(screen.getByText(/Rotate the KEK again to re-wrap what it still wraps/)).toBeInTheDocument();
  });

  it("an auditor sees the state but no actions", async () => {
    fakeApi({ "GET /api/v1/system/kek": { keks: [kek("kek-1", "superseded", {}), kek("kek-2", "active", {})],
                                          last_rotation: null, hsm: HSM },
              "GET /api/v1/system/health": health() });
    renderWith(<SystemPage />, { me: meAs("auditor") });
    expect(await screen.findByTestId("active-kek")).toHaveTextContent("kek-2");
    expect(screen.queryByTestId("rotate-kek")).toBeNull();
    expect(screen.queryByRole("button", { name: /Retire KEK/ })).toBeNull();
  });
});

describe("retireBlockedBy", () => {
  it("names why a KEK cannot be retired yet", () => {
    expect(retireBlockedBy(kek("a", "active", {}) as Schemas["KekPublic"], null)).toMatch(/rotate to a new one first/);
    expect(retireBlockedBy(kek("a", "superseded", { ca: 1 }) as Schemas["KekPublic"], null)).toMatch(/still wraps 1 stored item:/);
    expect(retireBlockedBy(kek("a", "superseded", {}) as Schemas["KekPublic"], rotation("running", 1) as Schemas["KekRotationPublic"]))
      .toMatch(/rotation is running/);
    expect(retireBlockedBy(kek("a", "superseded", {}) as Schemas["KekPublic"], null)).toBeNull();
  });
});
