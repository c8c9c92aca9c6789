import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { SignInPage } from "./SignIn";

describe("sign-in with a second factor", () => {
  it("asks for the authenticator's code when the server says the account has one", async () => {
    const server = fakeApi({
      "POST /api/v1/auth/login": ({ body }) => (body as { totp_code?: string }).totp_code
        ? { user: meAs("auditor"), csrf_token: "c", expires_at: "2026-11-24T12:00:00Z" }
        : problem(401, "totp_required", "this account has a second factor: send the authenticator's 6-digit code"),
    });
    renderWith(<SignInPage />, { me: null, at: "/sign-in", path: "/sign-in" });
    await userEvent.type(screen.getByLabelText(/Username/), "auditor1");
    await userEvent.type(screen.getByLabelText(/^Password/), "a passphrase 123");
    await userEvent.click(screen.getByRole("button", { name: "Sign in" }));
    const codeInput = await screen.findByLabelText(/Authenticator code/);
    expect(screen.queryByText(/Sign-in failed/)).toBeNull(); // a question, not an error
    await userEvent.type(codeInput, "12a34567");
    expect(codeInput).toHaveValue("1234567"); // digits only, and none cut
    expect(screen.getByText("6 digits; this one has 7")).toBeInTheDocument();
    await userEvent.click(screen.getByRole("button", { name: "Sign in" }));
    expect(server.calls("POST /api/v1/auth/login")).toHaveLength(1);
    await userEvent.type(codeInput, "{Backspace}");
    await userEvent.click(screen.getByRole("button", { name: "Sign in" }));
    await waitFor(() => expect(server.calls("POST /api/v1/auth/login")).toHaveLength(2));
    expect(server.calls("POST /api/v1/auth/login")[1].body).toMatchObject({ totp_code: "123456" });
  });

  it("offers single sign-on when the server has an identity provider, and shows its refusal", async () => {
    fakeApi({ "GET /api/v1/auth/methods": { password: true, oidc: true } });
    renderWith(<SignInPage />, { me: null, at: "/sign-in?sso_error=none%20of%20their%20groups%20maps%20to%20a%20role",
                                 path: "/sign-in" });
    expect(await screen.findByRole("link", { name: /single sign-on/ })).toHaveAttribute("href", "/api/v1/auth/oidc/login");
    expect(screen.getByTestId("sso-error")).toHaveTextContent("none of their groups maps to a role");
  });

  it("shows no single sign-on without an identity provider", async () => {
    const server = fakeApi({ "GET /api/v1/auth/methods": { password: true, oidc: false } });
    renderWith(<SignInPage />, { me: null, at: "/sign-in", path: "/sign-in" });
    await waitFor(() => expect(server.calls("GET /api/v1/auth/methods")).toHaveLength(1));
    expect(screen.queryByRole("link", { name: /single sign-on/ })).toBeNull();
  });
});
