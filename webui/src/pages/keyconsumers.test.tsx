import { screen, within } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { KeyConsumersPanel, countOf } from "./KeyConsumers";

const key = { id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-tde" } as Key;
const ago = (minutes: number) => new Date(Date.now() - minutes * 60_000).toISOString();
const CONSUMERS = [
  { kind: "database", name: "payments-db-01", detail: "key id 1", last_used_at: ago(5) },
  { kind: "database", name: "old-db", detail: "key id 2 (revoked)", last_used_at: null },
  { kind: "kmip-client", name: "backup-01.example.com", detail: "12 operations", last_used_at: ago(120) },
];

describe("a key's Used by panel", () => {
  it("lists the databases with their key ids and the KMIP clients, each linked where the role may go", async () => {
    const api = fakeApi({ "GET /api/v1/keys/:ref/consumers": { items: CONSUMERS } });
    renderWith(<KeyConsumersPanel k={key} />, { me: meAs("admin") });
    const table = await screen.findByTestId("key-consumers-table");
    expect(api.calls("GET /api/v1/keys/:ref/consumers")[0].params.ref).toBe(key.id);
    const db = within(table).getByText("payments-db-01").closest("tr")!;
    expect(within(db).getByRole("link", { name: "payments-db-01" })).toHaveAttribute("href", "/databases/payments-db-01");
    expect(db).toHaveTextContent("key id 1");
    expect(db).toHaveTextContent("5 minutes ago");
    expect(within(table).getByText("old-db").closest("tr")).toHaveTextContent("never");
    const kmip = within(table).getByText("backup-01.example.com").closest("tr")!;
    expect(within(kmip).getByRole("link", { name: "backup-01.example.com" })).toHaveAttribute("href", "/kmip-clients");
    expect(kmip).toHaveTextContent("KMIP client");
    expect(screen.getByTestId("key-consumers-count")).toHaveTextContent("2 databases · 1 KMIP client");
  });

  it("names without links for a role that cannot open those pages", async () => {
    fakeApi({ "GET /api/v1/keys/:ref/consumers": { items: CONSUMERS } });
    renderWith(<KeyConsumersPanel k={key} />, { me: meAs("operator") });
    const table = await screen.findByTestId("key-consumers-table");
    expect(within(table).getByText("payments-db-01")).toBeInTheDocument();
    expect(within(table).queryByRole("link")).toBeNull();
  });

  it("explains how databases and applications get access when nothing uses the key", async () => {
    fakeApi({ "GET /api/v1/keys/:ref/consumers": { items: [] } });
    renderWith(<KeyConsumersPanel k={key} />, { me: meAs("admin") });
    expect(await screen.findByText("No database or application uses this key")).toBeInTheDocument();
    expect(screen.getByTestId("key-consumers")).toHaveTextContent("Grant a key, as a MariaDB key id");
    expect(screen.getByTestId("key-consumers")).toHaveTextContent("uses the keys of its KMIP group and those granted to it");
  });

  it("says what went wrong when it cannot be loaded", async () => {
    fakeApi({ "GET /api/v1/keys/:ref/consumers": () => problem(500, "internal", "boom") });
    renderWith(<KeyConsumersPanel k={key} />, { me: meAs("admin") });
    const alert = await screen.findByRole("alert");
    expect(alert).toHaveTextContent("What uses this key could not be loaded");
    expect(alert).toHaveTextContent("give your administrator the request id");
  });

  it("counts by kind", () => {
    expect(countOf([])).toBe("");
    expect(countOf([CONSUMERS[0]] as never)).toBe("1 database");
  });
});
