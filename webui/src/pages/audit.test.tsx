import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { ApiError } from "../api/client";
import { AuditPage, auditFilterError, filterError, timeError, toIsoUtc } from "./Audit";
import { ChainStatus } from "./Dashboard";

const ago = (seconds: number) => new Date(Date.now() - seconds * 1000).toISOString();
const STATUS = {
  head_seq: 5120, key_fingerprint: "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12",
  public_key_pem: "-----BEGIN PUBLIC KEY-----\n…\n-----END PUBLIC KEY-----\n",
  last_checkpoint: { checkpoint: 5, seq: 5000, hash: "f".repeat(64), time: ago(120), prev: "0".repeat(64),
                     key: "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12", signature: "MEUCIQ==" },
  verified: { checkpoint: 4, seq: 4000, at: ago(3600) },
};

describe("the dashboard's audit chain panel", () => {
  it("shows the last checkpoint and verification without walking the chain on load", async () => {
    const server = fakeApi({ "GET /api/v1/audit/status": STATUS });
    renderWith(<ChainStatus />, { me: meAs("auditor") });
    expect(await screen.findByText("Verified to checkpoint #4")).toBeInTheDocument();
    expect(screen.getByText(/#5 at record 5000/)).toBeInTheDocument();
    expect(screen.getByText("1120 records")).toBeInTheDocument(); // head 5120 − verified checkpoint at 4000
    expect(server.calls("POST /api/v1/audit/verify")).toHaveLength(0);
  });

  it("verifies on request, from the last verified checkpoint, and says how far it went", async () => {
    const server = fakeApi({
      "GET /api/v1/audit/status": STATUS,
      "POST /api/v1/audit/verify": { ok: true, checked: 1120, head_seq: 5120, first_broken_seq: null, reason: null,
                                     from_seq: 4000, checkpoint: 5, outside_checked: 0 },
    });
    renderWith(<ChainStatus />, { me: meAs("auditor") });
    await userEvent.click(await screen.findByRole("button", { name: "Verify now" }));
    expect(await screen.findByText("1120 (after record #4000)")).toBeInTheDocument();
    expect(screen.queryByText("Zero-use statements")).toBeNull(); // none in this chain
    await waitFor(() => expect(server.calls("POST /api/v1/audit/verify")).toHaveLength(1));
    expect(server.calls("GET /api/v1/audit/status").length).toBeGreaterThanOrEqual(2); // refreshed after
  });

  it("counts the zero-use statements, and lists each one that breaks, each linked to its record", async () => {
    const used = (seq: number) => ({ seq, reason: `record ${seq} (datakey.decrypt) uses version 1 of key 'payments' after its zero-use statement (record 5001)` });
    fakeApi({
      "GET /api/v1/audit/status": STATUS,
      "POST /api/v1/audit/verify": { ok: false, checked: 1120, head_seq: 5120, first_broken_seq: 5002,
                                     reason: used(5002).reason, from_seq: 4000, statements: 2,
                                     problems: Array.from({ length: 12 }, (_, i) => used(5002 + i)) },
    });
    renderWith(<ChainStatus />, { me: meAs("auditor") });
    await userEvent.click(await screen.findByRole("button", { name: "Verify now" }));
    const problems = await screen.findByTestId("verify-problems");
    expect(screen.getByTestId("verify-result")).toHaveAttribute("data-ok", "false");
    expect(screen.getByText("Zero-use statements").nextElementSibling).toHaveTextContent(/^2$/);
    expect(problems).toHaveTextContent("#5002 record 5002 (datakey.decrypt) uses version 1 of key 'payments'");
    expect(problems.querySelectorAll("a")).toHaveLength(10);
    expect(problems.querySelector("a")).toHaveAttribute("href", "/audit?seq=5002");
    expect(problems).toHaveTextContent("… and 2 more (keyserver verify-audit lists every one)");
  });

  it("says when nothing was verified yet, and offers no button without audit:verify", async () => {
    fakeApi({ "GET /api/v1/audit/status": { ...STATUS, verified: null, last_checkpoint: null } });
    renderWith(<ChainStatus />, { me: meAs("operator") });
    expect(await screen.findByText("Not verified yet")).toBeInTheDocument();
    expect(screen.getByText("none yet")).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: "Verify now" })).toBeNull();
  });
});

describe("the audit log's search", () => {
  const record = (seq: number, actor: string) => ({
    seq, time: ago(seq), actor, actor_type: "host", action: "datakey.generate", object_type: "key",
    object_id: "0b6f3c1e-7d4a-4c2b-9e1f-5a8d2c3b4e6f", object_name: null as string | null, outcome: "allowed",
    source_ip: "10.0.0.7", request_id: "r", details: {}, prev_hash: "0".repeat(64), hash: "1".repeat(64),
  });

  it("sends the words and prefixes from a shared link, and new ones typed into the search box", async () => {
    const server = fakeApi({
      "GET /api/v1/audit/events": ({ url }) => ({
        items: url.searchParams.get("q") === "nothing" ? [] : [record(7, "host:db-1")], total: 1, total_exact: true,
        next_before_seq: null }),
    });
    renderWith(<AuditPage />, { at: "/audit?q=pay*+generate&actor=host:db-*", path: "/audit", me: meAs("auditor") });
    expect(await screen.findByTestId("audit-table")).toHaveTextContent("host:db-1");
    const first = server.calls("GET /api/v1/audit/events")[0].url.searchParams;
    expect(first.get("q")).toBe("pay* generate");
    expect(first.get("actor")).toBe("host:db-*");
    expect(screen.getByTestId("audit-search")).toHaveValue("pay* generate");
    await userEvent.clear(screen.getByTestId("audit-search"));
    await userEvent.type(screen.getByTestId("audit-search"), "nothing");
    await userEvent.click(screen.getByRole("button", { name: "Apply" }));
    expect(await screen.findByText("No records match")).toBeInTheDocument();
    expect(server.calls("GET /api/v1/audit/events").at(-1)?.url.searchParams.get("q")).toBe("nothing");
  });

  it("says a search's count is a lower bound when the server stopped counting", async () => {
    fakeApi({
      "GET /api/v1/audit/events": () => ({ items: [record(9, "host:db-1")], total: 10000, total_exact: false,
        next_before_seq: 9 }),
    });
    renderWith(<AuditPage />, { at: "/audit?q=generate", path: "/audit", me: meAs("auditor") });
    expect(await screen.findByTestId("audit-total")).toHaveTextContent("10,000+ matching records");
  });

  it("takes times as ISO 8601 in UTC, whatever the browser's locale, and refuses others with how to write them", async () => {
    expect(toIsoUtc("2026-11-22 10:30")).toBe("2026-11-22T10:30:00.000Z");
    expect(toIsoUtc("2026-11-22")).toBe("2026-11-22T00:00:00.000Z");
    for (const bad of ["11/22/2026 10:30 AM", "2026-02-31 10:00", "2026-11-22 25:00", "yesterday"]) {
      expect(toIsoUtc(bad)).toBeUndefined();
      expect(timeError(bad)).toMatch(/YYYY-MM-DD HH:mm, in UTC/);
    }
    const server = fakeApi({ "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null } });
    // A link from the dashboard carries the "T" form; the field shows it as typed elsewhere.
    renderWith(<AuditPage />, { at: "/audit?since=2026-11-25T12%3A00", path: "/audit", me: meAs("auditor") });
    const since = screen.getByTestId("audit-since");
    expect(since).toHaveValue("2026-11-25 12:00");
    await waitFor(() => expect(server.calls("GET /api/v1/audit/events")[0].url.searchParams.get("since"))
      .toBe("2026-11-25T12:00:00.000Z"));
    await userEvent.type(screen.getByTestId("audit-until"), "11/26/2026");
    await userEvent.click(screen.getByRole("button", { name: "Apply" }));
    expect(await screen.findByText(/Write it as YYYY-MM-DD HH:mm/)).toBeInTheDocument();
    expect(server.calls("GET /api/v1/audit/events").every((c) => !c.url.searchParams.has("until"))).toBe(true);
    await userEvent.clear(screen.getByTestId("audit-until"));
    await userEvent.type(screen.getByTestId("audit-until"), "2026-11-26 08:15");
    await userEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(server.calls("GET /api/v1/audit/events").at(-1)?.url.searchParams.get("until"))
      .toBe("2026-11-26T08:15:00.000Z"));
  });

  it("shows each object by its name, with its id in the record's drawer", async () => {
    const named = { ...record(12, "alice"), action: "key.revoke", object_name: "payments-db",
                    details: { name: "payments-db", reason: "key-compromise", message: "laptop stolen", versions: [1],
                               object_name: "payments-db" } };
    const path = `/srv/${"deep/".repeat(60)}ledger`;
    const guarded = { ...record(11, "bob"), action: "guard_point.create", object_type: "guard_point",
                      object_id: "5d1c9a2e-0f3b-4e6a-8c7d-1b2a3c4d5e6f", object_name: path };
    fakeApi({
      "GET /api/v1/audit/events": { items: [named, guarded, record(10, "host:db-1")], total: 3, total_exact: true,
                                    next_before_seq: null },
      "GET /api/v1/audit/events/12": named,
    });
    renderWith(<AuditPage />, { at: "/audit", path: "/audit", me: meAs("auditor") });
    const objects = await screen.findAllByTestId("audit-object");
    expect(objects.map((o) => o.textContent)).toEqual(["payments-dbkey", `${path}guard point`]);
    expect(objects[0]).toHaveAttribute("title", named.object_id);
    // Without a name, the type and id as before.
    expect(screen.getByTestId("audit-table")).toHaveTextContent(`key:${record(10, "x").object_id}`);
    await userEvent.click(screen.getByRole("button", { name: "Open audit record 12" }));
    const drawer = await screen.findByTestId("audit-record");
    expect(drawer).toHaveTextContent("Objectpayments-db");
    expect(drawer).toHaveTextContent(`Object ID${named.object_id}`);
    expect(drawer).toHaveTextContent('"message": "laptop stolen"');
  });

  it("refuses an over-long filter under its field, and words a server refusal by the form's labels", async () => {
    expect(filterError("q", "x".repeat(200))).toBeNull();
    expect(filterError("q", "x".repeat(201))).toBe("At most 200 characters (this has 201)");
    expect(filterError("object_id", "/".repeat(5000))).toBe("At most 4,096 characters (this has 5,000)");
    expect(filterError("since", "11/26/2026")).toMatch(/YYYY-MM-DD HH:mm, in UTC/);
    const worded = auditFilterError(new ApiError({ status: 422, code: "validation_error",
      detail: "Q: At most 200 characters; Object id: At most 4096 characters" })) as ApiError;
    expect(worded.detail).toBe("Search: At most 200 characters; Object ID: At most 4096 characters");
    const other = new ApiError({ status: 403, code: "forbidden", detail: "Q: kept" });
    expect(auditFilterError(other)).toBe(other);

    const server = fakeApi({ "GET /api/v1/audit/events": { items: [], total: 0, total_exact: true, next_before_seq: null } });
    // A link with a filter the server would refuse asks for nothing and says what is wrong.
    renderWith(<AuditPage />, { at: `/audit?actor=${"a".repeat(301)}`, path: "/audit", me: meAs("auditor") });
    expect(await screen.findByText("At most 300 characters (this has 301)")).toBeInTheDocument();
    expect(screen.getByText("These filters cannot be applied")).toBeInTheDocument();
    expect(server.calls("GET /api/v1/audit/events")).toHaveLength(0);
    await userEvent.clear(screen.getByTestId("audit-actor"));
    await userEvent.type(screen.getByTestId("audit-actor"), "alice");
    await userEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(server.calls("GET /api/v1/audit/events").at(-1)?.url.searchParams.get("actor"))
      .toBe("alice"));
    expect(screen.queryByText(/At most 300 characters/)).toBeNull();
  });
});
