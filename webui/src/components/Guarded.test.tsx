import { screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { meAs, renderWith } from "../test/render";
import { GuardedButton } from "./Guarded";

function buttons() {
  return (
    <>
      <GuardedButton perm="keys:rotate" data-testid="rotate">Rotate now</GuardedButton>
      <GuardedButton perm="keys:destroy" mode="hide" data-testid="destroy">Destroy</GuardedButton>
    </>
  );
}

describe("GuardedButton", () => {
  it("an admin gets working buttons", () => {
    renderWith(buttons(), { me: meAs("admin") });
    expect(screen.getByRole("button", { name: "Rotate now" })).toBeEnabled();
    expect(screen.getByRole("button", { name: "Destroy" })).toBeEnabled();
  });

  it("an operator may rotate but does not see destroy", () => {
    renderWith(buttons(), { me: meAs("operator") });
    expect(screen.getByRole("button", { name: "Rotate now" })).toBeEnabled();
    expect(screen.queryByRole("button", { name: "Destroy" })).toBeNull();
  });

  it("an auditor sees rotate disabled, with the reason", () => {
    renderWith(buttons(), { me: meAs("auditor") });
    const rotate = screen.getByRole("button", { name: "Rotate now" });
    expect(rotate).toBeDisabled();
    expect(rotate).toHaveAttribute("title", "Requires the keys:rotate permission");
    expect(screen.queryByRole("button", { name: "Destroy" })).toBeNull();
  });

  it("nobody signed in: nothing is allowed", () => {
    renderWith(buttons(), { me: null });
    expect(screen.getByRole("button", { name: "Rotate now" })).toBeDisabled();
  });
});
