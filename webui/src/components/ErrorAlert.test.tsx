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

  it("a refused field reads as words: no pydantic wording, no JSON", async () => {
    // As keyserver/api/problems.py answers a RequestValidationError.
    const body = { type: "https://strongroom.dev/problems/validation_error", title: "Unprocessable content", status: 422,
                   code: "validation_error", detail: "name: Value error, name must be 1-128 characters of letters, digits, . _ -",
                   request_id: "r1", errors: [
                     { loc: ["body", "name"], msg: "Value error, name must be 1-128 characters of letters, digits, . _ -", type: "value_error" },
                     { loc: ["body", "rotation_period_days"], msg: "Input should be greater than or equal to 1", type: "greater_than_equal" }] };
    const response = new Response(JSON.stringify(body), { status: 422, headers: { "content-type": "application/problem+json" } });
    const err = (await call(Promise.resolve({ error: body, response })).catch((e: unknown) => e)) as ApiError;
    expect(err.detail).toBe("Name: name must be 1-128 characters of letters, digits, . _ -; "
                            + "Rotation period days: Input should be greater than or equal to 1");
    // Each field's words, for the form to show under that field.
    expect(err.fields).toEqual({ name: "name must be 1-128 characters of letters, digits, . _ -",
                                 rotation_period_days: "Input should be greater than or equal to 1" });
    renderWith(<ErrorAlert error={err} />);
    const alert = screen.getByRole("alert");
    expect(alert).not.toHaveTextContent("Value error");
    expect(alert).not.toHaveTextContent("{");
    expect(alert).toHaveTextContent("Correct the value named above and submit again.");
  });

  it("a text over a limit reads as the limit, not as pydantic's sentence", async () => {
    const body = { title: "validation_error", status: 422, code: "validation_error",
                   detail: "username: String should have at most 64 characters", errors: [
                     { loc: ["body", "username"], msg: "String should have at most 64 characters", type: "string_too_long" },
                     { loc: ["body", "tags"], msg: "List should have at most 50 items after validation, not 51", type: "too_long" }] };
    const response = new Response(JSON.stringify(body), { status: 422 });
    const err = (await call(Promise.resolve({ error: body, response })).catch((e: unknown) => e)) as ApiError;
    expect(err.detail).toBe("Username: At most 64 characters; Tags: At most 50 items after validation, not 51");
    expect(err.fields.username).toBe("At most 64 characters");
  });

  it("a detail that is not prose (an object, a JSON dump) gives way to the problem's title", async () => {
    for (const detail of [{ msg: "x" }, '{"loc": ["body"], "msg": "bad"}']) {
      const body = { title: "Bad request", status: 400, code: "http_error", detail };
      const response = new Response(JSON.stringify(body), { status: 400 });
      const err = (await call(Promise.resolve({ error: body, response })).catch((e: unknown) => e)) as ApiError;
      expect(err.detail).toBe("Bad request");
    }
  });

  it("every error says what to do next, even one whose code it does not know", () => {
    for (const status of [400, 404, 409, 413, 422, 500, 503]) {
      expect(hintFor(new ApiError({ status, code: "something_new", detail: "x" }))).toBeTruthy();
    }
  });

  it("renders nothing without an error", () => {
    const { container } = renderWith(<ErrorAlert error={null} />);
    expect(container.querySelector("[role=alert]")).toBeNull();
  });
});
