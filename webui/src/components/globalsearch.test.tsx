import { screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { Route, Routes, useLocation } from "react-router";
import { describe, expect, it } from "vitest";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { GlobalSearch } from "./GlobalSearch";

function Where() {
  const l = useLocation();
  return <p data-testid="where">{l.pathname + l.search}</p>;
}

const app = (
  <Routes>
    <Route path="/" element={<GlobalSearch />} />
    <Route path="*" element={<Where />} />
  </Routes>
);

const KEY = { id: "0b6f3c1e-7d4a-4c2b-9e1f-5a8d2c3b4e6f", name: "payments-db", state: "active" };
const HOST = { id: "11111111-1111-4111-8111-111111111111", hostname: "pay-01.example.net", host_group: "payments" };

function server() {
  return fakeApi({
    "GET /api/v1/keys": ({ url }) => ({ items: url.searchParams.get("q") === "pay" ? [KEY] : [], total: 1, limit: 5, offset: 0 }),
    "GET /api/v1/hosts": ({ url }) => ({ items: url.searchParams.get("q") === "pay" ? [HOST] : [], total: 1, limit: 5,
                                         offset: 0, counts: {}, groups: [] }),
  });
}

describe("the console's search", () => {
  it("finds keys, hosts and the audit log's records from one box, opened from the keyboard", async () => {
    const api = server();
    renderWith(app, { me: meAs("auditor") });
    await userEvent.keyboard("{Control>}k{/Control}");
    await userEvent.type(await screen.findByTestId("global-search-input"), "pay");
    const results = screen.getByTestId("global-search-results");
    expect(await within(results).findByRole("option", { name: "Keys: payments-db (active)" })).toHaveAttribute("aria-selected", "true");
    expect(within(results).getByRole("option", { name: "Hosts: pay-01.example.net (payments)" })).toBeInTheDocument();
    expect(within(results).getByRole("option", { name: /^Audit log: Records holding “pay”/ })).toBeInTheDocument();
    expect(api.calls("GET /api/v1/keys").at(-1)?.url.searchParams.get("limit")).toBe("5");
    // Down twice and Enter: the audit log, searched for the words.
    await userEvent.keyboard("{ArrowDown}{ArrowDown}{Enter}");
    expect(await screen.findByTestId("where")).toHaveTextContent("/audit?q=pay");
  });

  it("offers only what the role may read, and opens a key with a click", async () => {
    const api = server();
    renderWith(app, { me: meAs("operator") }); // keys and hosts, not the audit log
    await userEvent.click(screen.getByTestId("global-search-open"));
    await userEvent.type(await screen.findByTestId("global-search-input"), "pay");
    const results = screen.getByTestId("global-search-results");
    const key = await within(results).findByRole("option", { name: "Keys: payments-db (active)" });
    expect(within(results).queryByRole("option", { name: /^Audit log/ })).toBeNull();
    await userEvent.click(key);
    expect(await screen.findByTestId("where")).toHaveTextContent("/keys/payments-db");
    expect(api.calls("GET /api/v1/hosts").length).toBeGreaterThan(0);
  });

  it("says when nothing is found", async () => {
    server();
    renderWith(app, { me: meAs("operator") });
    await userEvent.click(screen.getByTestId("global-search-open"));
    await userEvent.type(await screen.findByTestId("global-search-input"), "zzz");
    expect(await screen.findByText("Nothing found that your role may read.")).toBeInTheDocument();
  });
});
