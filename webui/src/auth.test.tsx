import { describe, expect, it } from "vitest";
import { signedOutNotice } from "./auth";

describe("the notice after the server ends a session", () => {
  it("says a password change ended it, so the old password is not tried again", () => {
    expect(signedOutNotice("session_replaced")).toMatch(/password was changed.*new password/);
  });

  it("tells an expiry from any other end", () => {
    expect(signedOutNotice("session_expired")).toMatch(/expired/);
    expect(signedOutNotice("not_authenticated")).toBe("Your session has ended. Sign in again to continue.");
  });
});
