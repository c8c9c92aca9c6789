import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { notifications } from "@mantine/notifications";
import { describe, expect, it, vi } from "vitest";
import type { User } from "../api/client";
import { fakeApi, json } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { UsersPage } from "./Users";

const bob: User = {
  id: "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb", username: "bob", full_name: "Bob", role: "operator", disabled: false,
  must_change_password: false, created_at: "2026-11-01T10:00:00Z", last_login_at: null, locked_until: null,
};

function server() {
  return fakeApi({
    "GET /api/v1/users": [bob],
    "PATCH /api/v1/users/:id": ({ body }) => ({ ...bob, ...(body as object) }),
    "POST /api/v1/users/:id/reset-password": { user: bob, one_time_password: "otp-123-456" },
  });
}

/** Choose `item` from bob's Actions menu; the dialog it opens, found by its name. Every step
 *  waits for its element by role (the menu closes and the dialog mounts as React gets to it). */
async function choose(item: string, dialog: string) {
  await userEvent.click(await screen.findByRole("button", { name: "Actions for bob" }));
  await userEvent.click(await screen.findByRole("menuitem", { name: item }));
  await waitFor(() => expect(screen.queryByRole("menu")).not.toBeInTheDocument());
  return within(await screen.findByRole("dialog", { name: dialog }));
}

describe("Users: no one-click role changes or resets", () => {
  it("makes an admin only after the username is typed, saying what the role may do", async () => {
    const api = server();
    renderWith(<UsersPage />, { me: meAs("admin") });
    const dialog = await choose("Make admin…", "Make bob admin");
    expect(api.calls("PATCH /api/v1/users/:id")).toHaveLength(0);
    expect(dialog.getByText(/everything, including users and the KEK/)).toBeInTheDocument();
    const submit = dialog.getByTestId("typed-confirm-submit");
    expect(submit).toBeDisabled();
    await userEvent.type(dialog.getByTestId("typed-confirm-input"), "bob");
    await userEvent.click(submit);
    await waitFor(() => expect(api.calls("PATCH /api/v1/users/:id")).toHaveLength(1));
    expect(api.calls("PATCH /api/v1/users/:id")[0].body).toEqual({ role: "admin" });
    // Done means the dialog is gone, not merely submitted: nothing of it outlives the test.
    await waitFor(() => expect(screen.queryByRole("dialog")).not.toBeInTheDocument());
  });

  it("resets a password only after confirmation, then shows the one-time password once", async () => {
    const api = server();
    renderWith(<UsersPage />, { me: meAs("admin") });
    const dialog = await choose("Reset password…", "Reset the password of bob");
    expect(api.calls("POST /api/v1/users/:id/reset-password")).toHaveLength(0);
    expect(dialog.getByText(/API tokens are revoked/)).toBeInTheDocument();
    await userEvent.type(dialog.getByTestId("typed-confirm-input"), "bob");
    await userEvent.click(dialog.getByTestId("typed-confirm-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/users/:id/reset-password")).toHaveLength(1));
    const secret = within(await screen.findByRole("dialog", { name: "One-time password" }));
    expect(secret.getByText("otp-123-456")).toBeInTheDocument();
  });

  it("says a reset held by the two-person rule waits, and shows no password", async () => {
    const detail = "'user.password' needs 1 approval(s) by other people holding 'users:manage'";
    const api = fakeApi({
      "GET /api/v1/users": [{ ...bob, role: "admin" }],
      "POST /api/v1/users/:id/reset-password": () => json(202, { status: "pending", code: "approval_required", detail,
                                                                  approval: { id: "r1", action: "user.password" } }),
    });
    const shown = vi.spyOn(notifications, "show");
    renderWith(<UsersPage />, { me: meAs("admin") });
    const dialog = await choose("Reset password…", "Reset the password of bob");
    await userEvent.type(dialog.getByTestId("typed-confirm-input"), "bob");
    await userEvent.click(dialog.getByTestId("typed-confirm-submit"));
    await waitFor(() => expect(api.calls("POST /api/v1/users/:id/reset-password")).toHaveLength(1));
    await waitFor(() => expect(shown).toHaveBeenCalledWith(expect.objectContaining({
      title: "Waiting for approval", message: detail })));
    expect(screen.queryByText(/one-time password/i)).not.toBeInTheDocument();
  });
});
