import { fireEvent, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { useState } from "react";
import { describe, expect, it } from "vitest";
import { hostPage } from "../test/hostPage";
import { fakeApi } from "../test/fakeApi";
import { renderWith } from "../test/render";
import { bodyFrom, describeRule, draftFrom, emptyRule, GuardPointsPage, RulesEditor, type GuardPoint,
         type Rule } from "./GuardPoints";

function Harness({ initial, onRules }: { initial: Rule[]; onRules: (r: Rule[]) => void }) {
  const [rules, setRules] = useState(initial);
  return <RulesEditor rules={rules} onChange={(r) => { setRules(r); onRules(r); }} />;
}

const gp: GuardPoint = {
  id: "5b1f7c1e-8a0f-4a53-9f4e-0d7b2f0c1a11", host_group: "db", host_id: null, path: "/srv/pg",
  backing_path: "/srv/.pg.strongroom", key_id: "6603c18c-39c3-4619-bb48-e05423636617", key_name: "pg-data",
  chunk_size: 4096, mode: "enforce", default_effect: "deny", revision: 3, rekey_generation: 0, unprotect_generation: 0,
  created_by: "admin",
  created_at: "2026-11-22T00:00:00Z", updated_at: "2026-11-22T00:01:00Z",
  rules: [{ effect: "permit", users: ["postgres"], uids: [], groups: [], executables: ["/usr/bin/postgres"], access: "all", audit: false }],
};

describe("guard point policy editing", () => {
  it("rules read as sentences", () => {
    expect(describeRule(gp.rules[0])).toBe("permit read and write to postgres via /usr/bin/postgres");
    expect(describeRule({ ...emptyRule(), effect: "deny", access: "write", uids: [1001], audit: true }))
      .toBe("deny write to uid 1001 (audited)");
  });

  it("rules are added, reordered and removed in order", () => {
    let last: Rule[] = [];
    renderWith(<Harness initial={[{ ...emptyRule(), effect: "permit", users: ["a"] }]} onRules={(r) => { last = r; }} />);
    fireEvent.click(screen.getByRole("button", { name: "Add rule" }));
    expect(screen.getAllByTestId("rule")).toHaveLength(2);
    fireEvent.click(screen.getByRole("button", { name: "Move rule 2 up" }));
    expect(last.map((r) => r.users)).toEqual([[], ["a"]]);
    fireEvent.click(screen.getByRole("button", { name: "Remove rule 1" }));
    expect(last).toHaveLength(1);
    expect(within(screen.getByTestId("rule")).getByText(/Rule 1 — permit read and write to a/)).toBeInTheDocument();
  });

  it("a read-only editor offers no changes", () => {
    renderWith(<RulesEditor rules={gp.rules} onChange={() => undefined} readOnly />);
    expect(screen.queryByRole("button", { name: "Add rule" })).toBeNull();
    expect(screen.queryByRole("button", { name: /Remove rule/ })).toBeNull();
  });

  it("an edited guard point round-trips to the request body; one target only", () => {
    const body = bodyFrom(draftFrom(gp));
    // the key goes by its id: KMIP clients may give several keys one name
    expect(body).toMatchObject({ host_group: "db", host_id: null, path: "/srv/pg", key: gp.key_id, chunk_size: 4096,
                                 mode: "enforce", default_effect: "deny" });
    expect(body.rules).toEqual(gp.rules);
    const fresh = bodyFrom({ ...draftFrom(), target: "host", host_id: "h1", host_group: "ignored", path: " /data ", key: "k" });
    expect(fresh).toMatchObject({ host_group: null, host_id: "h1", path: "/data", backing_path: null, mode: "learn" });
  });
});

describe("no traps in the editor", () => {
  it("a new rule refuses until opened up, and says it applies to everyone", () => {
    let last: Rule[] = [];
    renderWith(<Harness initial={[]} onRules={(r) => { last = r; }} />);
    fireEvent.click(screen.getByRole("button", { name: "Add rule" }));
    expect(last[0].effect).toBe("deny");
    expect(within(screen.getByTestId("rule")).getByText(/Rule 1 — deny read and write to everyone/)).toBeInTheDocument();
    expect(screen.getByTestId("rule-everyone")).toHaveTextContent("Applies to every user and program");
  });

  it("a new guard point starts empty after a cancelled draft", async () => {
    fakeApi({ "GET /api/v1/guard-points": [gp], "GET /api/v1/keys": { items: [], total: 0, limit: 100, offset: 0 },
              "GET /api/v1/hosts": ({ url }) => hostPage([], url) });
    renderWith(<GuardPointsPage />);
    await userEvent.click(await screen.findByTestId("new-guard-point"));
    await userEvent.type(await screen.findByLabelText(/Protected path/), "/srv/draft");
    await userEvent.click(screen.getByRole("button", { name: "Add rule" }));
    await userEvent.click(screen.getByRole("button", { name: "Cancel" }));
    await userEvent.click(screen.getByTestId("new-guard-point"));
    await waitFor(() => expect(screen.getByLabelText(/Protected path/)).toHaveValue(""));
    expect(screen.queryAllByTestId("rule")).toHaveLength(0);
  });
});

describe("encryption off and unprotect", () => {
  it("a guard point in mode off is flagged and offers Unprotect instead of Re-key", async () => {
    const off = { ...gp, id: "7c1f7c1e-8a0f-4a53-9f4e-0d7b2f0c1a22", path: "/srv/share", mode: "off" };
    const server = fakeApi({
      "GET /api/v1/guard-points": [gp, off],
      "POST /api/v1/guard-points/:id/unprotect": ({ params }) => ({ ...off, id: params.id, unprotect_generation: 1 }),
    });
    renderWith(<GuardPointsPage />);
    const table = await screen.findByTestId("guard-points-table");
    expect(within(table).getByText(/encryption off/)).toBeInTheDocument();
    expect(within(table).getByRole("button", { name: "Re-key /srv/pg" })).toBeInTheDocument();
    expect(within(table).queryByRole("button", { name: "Re-key /srv/share" })).toBeNull();
    await userEvent.click(within(table).getByRole("button", { name: "Unprotect /srv/share" }));
    expect(await screen.findByText(/decrypt every file of \/srv\/share in place/)).toBeInTheDocument();
    await userEvent.click(screen.getByRole("button", { name: "Decrypt in place" }));
    await waitFor(() => expect(server.calls("POST /api/v1/guard-points/:id/unprotect")).toHaveLength(1));
    expect(server.calls("POST /api/v1/guard-points/:id/unprotect")[0].params.id).toBe(off.id);
  });
});

describe("key choices", () => {
  it("offer active AES keys by id, telling apart keys that share a name", async () => {
    const { keyOptions } = await import("./GuardPoints");
    const base = { state: "active", algorithm: "AES" };
    const keys = [
      { ...base, id: "11111111-aaaa", name: "Symmetric Key" },
      { ...base, id: "22222222-bbbb", name: "Symmetric Key" },
      { ...base, id: "33333333-cccc", name: "payroll" },
      { ...base, id: "44444444-dddd", name: "mac", algorithm: "HMAC-SHA256" },
      { ...base, id: "55555555-eeee", name: "old", state: "deactivated" },
    ] as unknown as Parameters<typeof keyOptions>[0];
    expect(keyOptions(keys)).toEqual([
      { value: "11111111-aaaa", label: "Symmetric Key (11111111)" },
      { value: "22222222-bbbb", label: "Symmetric Key (22222222)" },
      { value: "33333333-cccc", label: "payroll" },
    ]);
  });
});
