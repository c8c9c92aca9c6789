import { screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { ApiError, call } from "../api/client";
import { renderWith } from "../test/render";
import { ErrorAlert, hintFor } from "./ErrorAlert";

const problem = (status: number, code: string, detail: string, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify({ type: `https://strongroom.dev/problems/${code}`, title: "x", status, code, detail,
                                request_id: "req-123" }),
               { status, headers: { "content-type": "application/problem+json", ...headers } });

describe("API errors", () => {
  it("call() turns problem+json into an ApiError with code, detail and request id", async () => {
    const response = problem(409, "illegal_state", "key 'k' is destroyed; a destroyed key cannot be rotated");
    const body = await response.clone().json();
    await expect(call(Promise.resolve({ error: body, response }))).rejects.toMatchObject({
      status: 409, code: "illegal_state", detail: "key 'k' is destroyed; a destroyed key cannot be rotated", requestId: "req-123",
    });
  });

  it("a network failure is an ApiError too", async () => {
    await expect(call(Promise.reject(new TypeError("Failed to fetch")))).rejects.toMatchObject({ status: 0, code: "network" });
  });

  it("shows the detail, an actionable hint, the code and the request id", () => {
    renderWith(<ErrorAlert error={new ApiError({ status: 403, code: "forbidden", detail: "operator may not keys:destroy", requestId: "abc" })} />);
    const alert = screen.getByRole("alert");
    expect(alert).toHaveTextContent("Not allowed");
    expect(alert).toHaveTextContent("operator may not keys:destroy");
    expect(alert).toHaveTextContent("Your role does not allow this action");
    expect(alert).toHaveTextContent("forbidden");
    expect(alert).toHaveTextContent("abc");
  });

  it("rate limiting says how long to wait", () => {
    expect(hintFor(new ApiError({ status: 429, code: "rate_limited", detail: "slow down", retryAfter: "30" })))
      .toMatch(/30 seconds/);
  });

  it("renders nothing without an error", () => {
    const { container } = renderWith(<ErrorAlert error={null} />);
    expect(container.querySelector("[role=alert]")).toBeNull();
  });
});
