import { screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { ActorUsagePanel, HeartbeatTimeline, KeyUsagePanel } from "./Usage";

const KEY = "0b6f3c1e-7d4a-4c2b-9e1f-5a8d2c3b4e6f";
const HOST = "11111111-1111-4111-8111-111111111111";

function usage(url: URL, counts: Record<string, number>, top: { name: string; count: number }[]) {
  const since = new Date(url.searchParams.get("since")!);
  const until = new Date(url.searchParams.get("until")!);
  const bucket = (url.searchParams.get("bucket") ?? "hour") as "hour" | "day";
  const step = bucket === "hour" ? 3_600_000 : 86_400_000;
  const buckets = [];
  for (let t = Math.floor(since.getTime() / step) * step; t < until.getTime(); t += step) {
    buckets.push({ start: new Date(t).toISOString(), counts: t + step >= until.getTime() ? counts : {} });
  }
  const actions = Object.entries(counts).map(([name, count]) => ({ name, count })).sort((a, b) => b.count - a.count);
  return { bucket, buckets, actions, total: actions.reduce((n, a) => n + a.count, 0), top };
}

describe("a key's usage", () => {
  it("draws operations by action and links its top users to their audit records", async () => {
    const server = fakeApi({
      "GET /api/v1/audit/usage": ({ url }) => usage(url, { "datakey.generate": 1200, "datakey.decrypt": 300 },
                                                    [{ name: "host:db-1", count: 1100 }, { name: "kmip:backup", count: 400 }]),
    });
    renderWith(<KeyUsagePanel keyId={KEY} />, { me: meAs("auditor") });
    const chart = await screen.findByTestId("usage-chart");
    expect(chart).toHaveAttribute("data-total", "1500");
    expect(within(chart).getByRole("img")).toHaveAccessibleName(
      "Operations per hour by action: 1200 datakey.generate, 300 datakey.decrypt");
    expect(within(chart).getByRole("link", { name: "host:db-1" }))
      .toHaveAttribute("href", `/audit?object_id=${KEY}&actor=host%3Adb-1`);
    expect(server.calls("GET /api/v1/audit/usage")[0].url.searchParams.get("key_id")).toBe(KEY);
    await userEvent.click(screen.getByRole("radio", { name: "30 days" }));
    await screen.findByTestId("usage-chart");
    expect(server.calls("GET /api/v1/audit/usage").at(-1)?.url.searchParams.get("bucket")).toBe("day");
  });

  it("says when the key was not used, rather than drawing an empty chart", async () => {
    fakeApi({ "GET /api/v1/audit/usage": ({ url }) => usage(url, {}, []) });
    renderWith(<KeyUsagePanel keyId={KEY} />, { me: meAs("auditor") });
    expect(await screen.findByText("No use in the last 24 hours")).toBeInTheDocument();
  });
});

describe("a host's key usage and heartbeats", () => {
  it("names the keys it used most, linking to them", async () => {
    const server = fakeApi({
      "GET /api/v1/audit/usage": ({ url }) => usage(url, { "key.deliver": 12 }, [{ name: KEY, count: 12 }]),
      "GET /api/v1/keys/:ref": { id: KEY, name: "payments-db" },
    });
    renderWith(<ActorUsagePanel actor="host:db-1" />, { me: meAs("auditor") });
    const link = await screen.findByRole("link", { name: "payments-db" });
    expect(link).toHaveAttribute("href", `/keys/${KEY}`);
    expect(server.calls("GET /api/v1/audit/usage")[0].url.searchParams.get("actor")).toBe("host:db-1");
  });

  it("shows each hour heard from or not", async () => {
    fakeApi({
      "GET /api/v1/hosts/:id/heartbeats": ({ url }) => {
        const since = new Date(url.searchParams.get("since")!).getTime();
        return Array.from({ length: 24 }, (_, i) => ({
          hour: new Date(since + i * 3_600_000).toISOString(), count: i < 20 ? 120 : 0 }));
      },
    });
    renderWith(<HeartbeatTimeline hostId={HOST} />, { me: meAs("auditor") });
    const timeline = await screen.findByTestId("heartbeat-timeline");
    expect(timeline).toHaveAttribute("data-heard", "20");
    expect(within(timeline).getByRole("img")).toHaveAccessibleName("Heard from in 20 of the last 24 hours");
  });
});
