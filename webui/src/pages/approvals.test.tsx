import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../api/client";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { AccountPage } from "./Account";
import { ApprovalsPage } from "./Approvals";

type Approval = Schemas["ApprovalPublic"];
const soon = new Date(Date.now() + 3_600_000).toISOString();
const now = new Date().toISOString();

function request(over: Partial<Approval>): Approval {
  return { id: "a1", action: "key.destroy", target: "payments-db", params: {}, requested_by: "alice", required: 1,
           approvals: [], state: "pending", created_at: now, expires_at: soon, decided_at: null, result: null, ...over };
}

describe("approvals", () => {
  it("approves someone else's request after saying it runs now, as them", async () => {
    const server = fakeApi({
      "GET /api/v1/approvals": [request({}), request({ id: "a2", requested_by: "admin1", target: "hr-files" })],
      "POST /api/v1/approvals/:id/approve": ({ params }) => ({
        approval: request({ id: params.id, state: "executed", approvals: [{ by: "admin1", at: now }] }), executed: true }),
    });
    renderWith(<ApprovalsPage />, { me: meAs("admin") });
    const rows = await screen.findAllByTestId("approval-row");
    expect(server.calls("GET /api/v1/approvals")[0].url.searchParams.get("state")).toBe("pending");
    // One's own request waits for someone else.
    expect(rows[1]).toHaveTextContent("asked by you: someone else approves");
    expect(within(rows[1]).queryByRole("button", { name: /^Approve/ })).toBeNull();
    await userEvent.click(within(rows[0]).getByRole("button", { name: "Approve: Destroy a key, payments-db" }));
    const dialog = await screen.findByRole("dialog", { name: "Approve: Destroy a key" });
    expect(dialog).toHaveTextContent("Yours is the last approval needed: it runs now, as alice, and cannot be undone.");
    await userEvent.click(within(dialog).getByTestId("approval-confirm"));
    await waitFor(() => expect(screen.queryByRole("dialog")).toBeNull());
    expect(server.calls("POST /api/v1/approvals/:id/approve").map((c) => c.params.id)).toEqual(["a1"]);
    await waitFor(() => expect(server.calls("GET /api/v1/approvals").length).toBeGreaterThan(1)); // read again
  });

  it("shows the server's refusal in the dialog", async () => {
    fakeApi({
      "GET /api/v1/approvals": [request({}), request({ id: "a3", action: "kek.rotate", target: "kek" })],
      "POST /api/v1/approvals/:id/approve": () => problem(409, "approval_closed", "this request expired"),
    });
    renderWith(<ApprovalsPage />, { me: meAs("admin") });
    const rows = await screen.findAllByTestId("approval-row");
    await userEvent.click(within(rows[0]).getByRole("button", { name: /^Approve/ }));
    await userEvent.click(within(await screen.findByRole("dialog")).getByTestId("approval-confirm"));
    expect(await screen.findByText(/this request expired/)).toBeInTheDocument();
  });

  it("an auditor reads the requests and decides none", async () => {
    fakeApi({ "GET /api/v1/approvals": [request({}), request({ id: "a3", action: "kek.rotate", target: "kek" })] });
    renderWith(<ApprovalsPage />, { me: meAs("auditor") });
    const table = await screen.findByTestId("approvals-table");
    expect(within(table).getAllByTestId("approval-row")).toHaveLength(2);
    expect(within(table).queryByRole("button")).toBeNull();
  });

  it("says what the rule is when nothing waits", async () => {
    fakeApi({ "GET /api/v1/approvals": [] });
    renderWith(<ApprovalsPage />, { me: meAs("admin") });
    expect(await screen.findByText("Nothing waits for approval")).toBeInTheDocument();
    expect(screen.getByText(/STRONGROOM_APPROVALS/)).toBeInTheDocument();
  });
});

describe("your account's second factor", () => {
  it("sets up an authenticator: QR code and key shown once, turned on by a first code", async () => {
    const server = fakeApi({
      "POST /api/v1/auth/totp": { secret: "JBSWY3DPEHPK3PXP", otpauth_uri: "otpauth://totp/Strongroom:admin1?secret=JBSWY3DPEHPK3PXP&issuer=Strongroom" },
      "POST /api/v1/auth/totp/confirm": () => new Response(null, { status: 204 }),
    });
    renderWith(<AccountPage />, { me: { ...meAs("admin"), second_factor: false } });
    await userEvent.click(screen.getByTestId("totp-start"));
    expect(await screen.findByRole("img", { name: /^QR code of your authenticator key/ })).toBeInTheDocument();
    expect(screen.getByTestId("totp-secret")).toHaveTextContent("JBSWY3DPEHPK3PXP");
    expect(screen.getByTestId("totp-confirm")).toBeDisabled();
    await userEvent.type(screen.getAllByRole("textbox")[0], "123456");
    await userEvent.click(screen.getByTestId("totp-confirm"));
    await waitFor(() => expect(server.calls("POST /api/v1/auth/totp/confirm")).toHaveLength(1));
    expect(server.calls("POST /api/v1/auth/totp/confirm")[0].body).toEqual({ code: "123456" });
    expect(server.calls("POST /api/v1/auth/totp")).toHaveLength(1);
  });

  it("says it is on, and how to replace a lost device", () => {
    fakeApi({});
    renderWith(<AccountPage />, { me: { ...meAs("admin"), second_factor: true } });
    expect(screen.getByTestId("totp-on")).toHaveTextContent("An administrator can reset it");
    expect(screen.queryByTestId("totp-start")).toBeNull();
  });
});
