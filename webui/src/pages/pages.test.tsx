import { screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { renderWith } from "../test/render";
import { toIsoUtc } from "./Audit";
import { VersionTimeline } from "./KeyDetail";
import { parseTags } from "./Keys";

const key: Key = {
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-db", description: "", owner: "admin", tags: {},
  algorithm: "AES", length_bits: 256, state: "active", current_version: 2, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null,
  versions: [1, 2].map((v) => ({
    version: v, state: v === 2 ? "active" : "deactivated", created_at: "2026-11-22T00:00:00Z",
    activation_date: "2026-11-22T00:00:00Z", deactivation_date: v === 1 ? "2026-11-22T00:01:00Z" : null,
    compromise_date: null, destroy_date: null, revocation_reason: null, revocation_message: null,
    wrapping_key_id: "kek-1", wrapping_mechanism: "RSA-OAEP-SHA1", replaces: v === 2 ? 1 : null, replaced_by: v === 1 ? 2 : null,
  })),
};

describe("pieces of the pages", () => {
  it("the version timeline lists newest first with each state", () => {
    renderWith(<VersionTimeline k={key} />);
    const items = screen.getByTestId("version-timeline").querySelectorAll("[data-state]");
    expect([...items].map((i) => i.getAttribute("data-state"))).toEqual(["active", "deactivated"]);
  });

  it("tags are name=value entries; a bare name has an empty value", () => {
    expect(parseTags(["env=prod", "pci", "team = payments "])).toEqual({ env: "prod", pci: "", team: "payments" });
  });

  it("audit time filters are read as UTC", () => {
    expect(toIsoUtc("2026-11-22T10:30")).toBe("2026-11-22T10:30:00.000Z");
    expect(toIsoUtc("")).toBeUndefined();
  });
});
