import { screen, within } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { AuditEvent, Host } from "../api/client";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { GuardPointTimeline, guardPointRows } from "./GuardPointTimeline";

const H = 3_600_000;
const since = Date.UTC(2026, 10, 25, 0);
const until = since + 24 * H;

function record(action: string, path: string, at: number, status?: number): AuditEvent {
  return {
    seq: at / 1000, time: new Date(at + 5_000).toISOString(), actor: "host:pg-01", actor_type: "host", action,
    object_type: "file", object_id: path, outcome: "allowed", source_ip: "10.0.0.7", request_id: "r",
    details: { guard_point: "gp", reported_at: new Date(at).toISOString(), ...(status === undefined ? {} : { status }) },
    prev_hash: "0".repeat(64), hash: "1".repeat(64),
  };
}

const reported = (path: string, state: string) => ({ path, key: "pg-main", state }) as Host["guard_points"][number];

describe("guard point states over time", () => {
  it("cuts the window at each mount and unmount, telling a crash from a clean stop", () => {
    const rows = guardPointRows([
      record("agent.guardpoint.unmounted", "/srv/pg", since + 2 * H, 0),
      record("agent.guardpoint.mounted", "/srv/pg", since + 3 * H),
      record("agent.guardpoint.unmounted", "/srv/pg", since + 10 * H, 139),
      record("agent.guardpoint.mounted", "/srv/pg", since + 11 * H),
      record("agent.guardpoint.rewrapped", "/srv/pg", since + 12 * H),
    ], [reported("/srv/pg", "mounted"), reported("/srv/wal", "unmounted")], since, until);
    expect(rows.map((r) => r.path)).toEqual(["/srv/pg", "/srv/wal"]);
    // Before the first record, an unmount says it was serving.
    expect(rows[0].spans).toEqual([
      { from: since, to: since + 2 * H, state: "mounted" },
      { from: since + 2 * H, to: since + 3 * H, state: "stopped" },
      { from: since + 3 * H, to: since + 10 * H, state: "mounted" },
      { from: since + 10 * H, to: since + 11 * H, state: "crashed" },
      { from: since + 11 * H, to: until, state: "mounted" },
    ]);
    expect(rows[0].changes.map((c) => c.state)).toEqual(["stopped", "mounted", "crashed", "mounted"]);
    // No record in the window: what the host reports now, all along.
    expect(rows[1].spans).toEqual([{ from: since, to: until, state: "stopped" }]);
  });

  it("says nothing is known before a first mount, and draws the picture from the host's audit records", async () => {
    const now = Date.now();
    const server = fakeApi({
      "GET /api/v1/audit/events": () => ({ items: [record("agent.guardpoint.unmounted", "/srv/pg", now - 2 * H, 139),
                                                   record("agent.guardpoint.mounted", "/srv/pg", now - 4 * H)],
                                           total: 2, total_exact: true, next_before_seq: null }),
    });
    const host = { id: "h", hostname: "pg-01", guard_points: [reported("/srv/pg", "mounted")] } as unknown as Host;
    renderWith(<GuardPointTimeline h={host} />, { me: meAs("auditor") });
    const row = await screen.findByTestId("guard-point-row");
    expect(row).toHaveAttribute("data-states", "unknown mounted crashed");
    expect(within(row).getByRole("img")).toHaveAccessibleName(/^\/srv\/pg: no record from .*; serving \(mounted\) from .*; stopped on a crash from/);
    expect(screen.getByTestId("guard-point-changes")).toHaveTextContent("stopped on a crash (status 139)");
    const q = server.calls("GET /api/v1/audit/events")[0].url.searchParams;
    expect(q.get("actor")).toBe("host:pg-01");
    expect(q.get("action")).toBe("agent.guardpoint.");
  });
});
