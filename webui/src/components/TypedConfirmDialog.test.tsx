import { screen } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it, vi } from "vitest";
import { ApiError } from "../api/client";
import { renderWith } from "../test/render";
import { TypedConfirmDialog } from "./TypedConfirmDialog";

function setup(extra: { error?: unknown; blockedBy?: string } = {}) {
  const onConfirm = vi.fn();
  renderWith(
    <TypedConfirmDialog opened onClose={() => {}} title="Destroy payments-db" phrase="payments-db"
                        actionLabel="Destroy every version" onConfirm={onConfirm} {...extra}>
      <p>This cannot be undone.</p>
    </TypedConfirmDialog>,
  );
  return { onConfirm, input: screen.getByTestId("typed-confirm-input"),
           submit: screen.getByRole("button", { name: "Destroy every version" }) };
}

describe("TypedConfirmDialog", () => {
  it("cannot be submitted while the server would refuse, and says why", async () => {
    const { input, submit, onConfirm } = setup({ blockedBy: "The key has an active version: deactivate or revoke it first" });
    expect(screen.getByTestId("typed-confirm-blocked")).toHaveTextContent("deactivate or revoke it first");
    await userEvent.type(input, "payments-db{Enter}");
    expect(submit).toBeDisabled();
    expect(onConfirm).not.toHaveBeenCalled();
  });

  it("stays disabled until the exact name is typed", async () => {
    const { input, submit, onConfirm } = setup();
    expect(submit).toBeDisabled();
    await userEvent.type(input, "payments-d");
    expect(submit).toBeDisabled();
    await userEvent.type(input, "b ");
    expect(submit).toBeDisabled(); // a trailing space is not the name
    await userEvent.type(input, "{Backspace}");
    expect(submit).toBeEnabled();
    await userEvent.click(submit);
    expect(onConfirm).toHaveBeenCalledTimes(1);
  });

  it("is case-sensitive and cannot be submitted with Enter early", async () => {
    const { input, submit, onConfirm } = setup();
    await userEvent.type(input, "PAYMENTS-DB{Enter}");
    expect(submit).toBeDisabled();
    expect(onConfirm).not.toHaveBeenCalled();
  });

  it("labels the input with the phrase to type", () => {
    setup();
    expect(screen.getByLabelText(/to confirm/)).toBe(screen.getByTestId("typed-confirm-input"));
  });

  it("shows the server's refusal", () => {
    setup({ error: new ApiError({ status: 409, code: "illegal_state", detail: "key 'payments-db' has an active version" }) });
    expect(screen.getByRole("alert")).toHaveTextContent("key 'payments-db' has an active version");
  });
});
